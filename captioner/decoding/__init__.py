"""Decoding: what turns a step function into token ids, knowing no model (nanochat's engine: token id sequences in
and out; a decoder hands it a step function and its state).

    options.py   DecodeOptions: beam, n-best, attention mode, max length, length penalty, trigram blocking,
                 <unk>; built once from a config's eval section and a command's flags, each setting's one default
    search.py    greedy and batched beam search over a step function and token ids; ``search()`` picks one
    logits.py    Logits: a step's k best words read from raw logits (the fused C read where it applies)

The loop that decodes a split with a model is captioner/evaluation/split.py's (``decode_batches``).
"""

"""Model components of the captioner (Xu et al. 2015, "Show, Attend and Tell").

    encoder.py     backbones -> annotation grid (with backbones.py, one builder per backbone family;
                   transform.py, the preprocessing; weights.py, the weight files)
    scorers.py     attention scoring functions
    attention.py   soft / hard / key-value / multi-head attention
    decoders/      the decoder contract and registry: the paper's attention LSTM decoder, its fast path, a
                   Transformer decoder
    captioner.py   encoder + decoder as one module (generate)
    ensemble.py    several captioners over one cached representation, decoded as one

Pure modules: tensors and token ids in and out; they import neither the config, the vocabulary, the data layer
nor checkpoints (``captioner/api.py`` builds them from a config). Submodules are imported explicitly by users;
nothing is built at import time.
"""

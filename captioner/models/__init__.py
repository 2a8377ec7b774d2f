"""Model components of the captioner (Xu et al. 2015, "Show, Attend and Tell").

scorers.py (attention scoring functions), attention.py (soft / hard / key-value /
multi-head attention), decoders/ (the decoder contract and registry: the paper's attention LSTM decoder,
its fast path, a Transformer decoder), encoder.py (backbones
-> annotation grid), captioner.py (encoder + decoder as one module), pointer.py (a pointer
network, Vinyals et al. 2015). Pure modules: tensors and token ids in and out; they import
neither the config, the vocabulary, the data layer nor checkpoints (``captioner/api.py`` builds
them from a config). Submodules are imported explicitly by users; nothing is built at import time.
"""

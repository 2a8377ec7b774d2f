"""Model components of the captioner (Xu et al. 2015, "Show, Attend and Tell").

scorers.py (attention scoring functions), attention.py (soft / hard / key-value /
multi-head attention), decoder.py (the paper's attention LSTM decoder), pointer.py
(a pointer network, Vinyals et al. 2015). Submodules are imported explicitly by users;
nothing is built at import time.
"""

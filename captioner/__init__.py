"""captioner: Show, Attend and Tell image captioning (Xu et al. 2015, arXiv:1502.03044).

The public Python API is deliberately tiny (CLIP-style)::

    from captioner import load_captioner
    model = load_captioner()                     # the shipped Flickr8k model (offline)
    model = load_captioner("runs/demo/best.pt")  # or a checkpoint / run directory
    model = load_captioner("models/my-captioner")  # or a model folder (captioner export), or "owner/name"
    model = load_captioner(["runs/a", "runs/b"])  # or an ensemble: their mean log-probabilities per word
    results = model.caption(["photo.jpg"], beam=3)
"""

from captioner.version import __version__


def load_captioner(path=None, device="auto", ensemble_attention: str | None = None):
    """Load a trained captioner from a checkpoint file or run directory, a model folder (`captioner export`), a
    hub model id ("owner/name", from huggingface_hub's local cache), or with no path (or a shipped model's name
    such as "flickr8k") the pretrained model shipped with the package; a list of several of those is an
    ensemble, whose captions show the first model's attention or, with ensemble_attention="mean", the mean
    (see captioner/api.py). ``device``: "auto" (CUDA when present, else the CPU), "cpu", "cuda" or "cuda:N"."""
    from captioner.api import load_captioner as _load

    return _load(path, device=device, ensemble_attention=ensemble_attention)


__all__ = ["load_captioner", "__version__"]

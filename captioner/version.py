"""The package's version, in a module of its own: code inside the package reads it from here, not from the
package's front door (captioner/__init__.py), which reaches up to the application layer (api.py)."""

__version__ = "0.1.0"

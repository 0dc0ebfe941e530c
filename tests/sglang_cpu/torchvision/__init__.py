"""Import-only stand-in for torchvision in the SGLang test environment (tests/test_hidden_sglang.py).

SGLang imports `torchvision.io.decode_jpeg` at the top of `sglang.srt.utils.common`, and transformers then
imports a few torchvision names for image processors. PyPI's torchvision is a CUDA build that cannot load
against the CPU torch these machines use, and nothing the hidden-state backend touches decodes images. Any
name resolves to an object that refuses to be used, so an image path reached by mistake fails loudly.
"""

import enum

__version__ = "0.0.0+import-only"


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision is not installed in this environment (import-only stand-in)")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name in ("InterpolationMode", "ImageReadMode"):
        members = "NEAREST NEAREST_EXACT BILINEAR BICUBIC BOX HAMMING LANCZOS"
        members += " UNCHANGED GRAY GRAY_ALPHA RGB RGB_ALPHA"
        return enum.Enum(name, members)
    return _Unavailable

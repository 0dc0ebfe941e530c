from torchvision import __getattr__  # noqa: F401  (see torchvision/__init__.py)

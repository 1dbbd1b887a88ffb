"""An import-only stand-in for torchvision.

The registry's torchvision fails to load against torch 2.13+cpu ("operator torchvision::nms does
not exist"), and SGLang imports it only for multimodal model configs. Any ``torchvision.*``
module imports; any attribute is a placeholder class; calling one raises. Text models never
reach it.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+overlap-sim-stub"


class _AnyAttribute(type):
    """Class attributes (e.g. ``InterpolationMode.NEAREST_EXACT``) are placeholders too."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Placeholder,), {})


class _Placeholder(metaclass=_AnyAttribute):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torchvision is stubbed out in this environment (text models only)")

    def __class_getitem__(cls, item):
        return cls


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_Placeholder,), {})


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _SubmoduleFinder())

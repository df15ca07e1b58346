"""Moved to kneecap.demo.kubeapi (the demo runs it); this name is the same module object, so monkeypatching works."""
import sys

from kneecap.demo import kubeapi as _kubeapi

sys.modules[__name__] = _kubeapi

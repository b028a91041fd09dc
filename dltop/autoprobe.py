"""Zero-code mode (DLTOP_PROBE=1, through dltop_probe.pth): wait for torch, then learn what can be learnt unasked.

This module costs an interpreter start next to nothing: it imports nothing and only puts a finder on
sys.meta_path that answers for `torch` alone. A process that never imports torch (the multiprocessing
resource_tracker, a shell's python -c) publishes nothing; one that does gets dltop.probe.hooks installed right
after torch's import, and publishes only once it trains (docs/probe.md, "Without changing the script").
"""

import sys

# The modules whose import puts the hooks in: torch's, and the frameworks' Trainers (their own epochs, their
# validation apart: dltop.probe.hooks.framework gives each Trainer the probe's callback)
HOOKED = {"torch", "lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer", "transformers.trainer"}


class TorchFinder:
    """A meta-path finder that finds nothing itself: on the import of `torch` (or of a framework's Trainer) it
    asks the finders after it, and has the spec's loader install the hooks once the module has run."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):  # type: ignore[no-untyped-def]
        """The module's spec from the other finders, its loader made to call the hooks after it; None for the
        modules not hooked."""
        if name not in HOOKED:
            return None
        HOOKED.discard(name)  # once each
        if not HOOKED and cls in sys.meta_path:
            sys.meta_path.remove(cls)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def run(module):  # type: ignore[no-untyped-def]
            exec_module(module)
            try:
                from dltop.probe import hooks
                if name == "torch":
                    hooks.install(module)
                else:
                    hooks.framework(name, module)
            except Exception as e:  # the probe must never take the job down
                sys.stderr.write(f"dltop.probe: DLTOP_PROBE is set but its hooks did not go in: {e!r}\n")

        loader.exec_module = run
        return spec


def activate() -> None:
    """Watch for torch's import (idempotent); torch already imported: install the hooks now."""
    if "torch" in sys.modules:
        from dltop.probe import hooks
        hooks.install(sys.modules["torch"])
    elif TorchFinder not in sys.meta_path:
        sys.meta_path.insert(0, TorchFinder)


activate()

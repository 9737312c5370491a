"""gpuk8s node GPU check: can the interpreter running this do the PyTorch fallback?

Prints one line and exits 0 when it can ("torch 2.9.0+cu128 (CUDA 12.8)"); otherwise exits 1
with the reason: "ModuleNotFoundError: torch", "torch 2.5.0 built without CUDA",
"torch.cuda.is_available() is False: <why>". Runs on the node under whatever python3 is there
(3.6 and later), so it is plain Python with no gpuk8s import."""

import sys


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:300]


def main() -> int:
    try:
        import torch
    except ModuleNotFoundError as exc:
        print("ModuleNotFoundError: " + _one_line(exc.name or exc))
        return 1
    except Exception as exc:  # a broken install: ImportError, OSError (a missing .so)...
        print(type(exc).__name__ + ": " + _one_line(exc))
        return 1
    version = _one_line(getattr(torch, "__version__", "?"))
    if getattr(torch.version, "cuda", None) is None:
        print("torch " + version + " built without CUDA")
        return 1
    if not torch.cuda.is_available():
        try:  # is_available() only says False; init() raises with the reason
            torch.cuda.init()
            reason = "torch.cuda.device_count() is " + str(torch.cuda.device_count())
        except Exception as exc:
            reason = _one_line(exc)
        print("torch.cuda.is_available() is False: " + reason)
        return 1
    print("torch " + version + " (CUDA " + _one_line(torch.version.cuda) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the shipped instance files: ``python -m pipeopt.zoo [DIR]`` (default ``./instances``).

The set (:data:`SHIPPED`) is deterministic: the same code writes byte-identical files.

* ``homogeneous/``: AlexNet, GoogLeNet, VGG16, ResNet50, BERT-Large and GPT-2 XL on 4, 8 and
  16 NVIDIA A100 40GB GPUs (fp16, default microbatches). 4 and 8 GPUs sit in one DGX A100
  node (NVLink 3 through NVSwitch, 300 GB/s each way); 16 GPUs span two nodes and the
  pipeline's slowest link is InfiniBand HDR (25 GB/s).
* ``memory/``: instances whose memory limit changes the optimum (checked by the tests with the
  exact DP): GPT-3 6.7B on 8 and 16 A100 40GB, BERT-Large (microbatch 16) on 4 V100 16GB over
  NVLink 2, VGG16 (microbatch 128) on 8 T4 over PCIe 4; and, for activation recomputation (issue
  25), LLaMA-7B (microbatch 8) and GPT-2 XL (microbatch 16) on 8 A100 40GB and on 8 A100 80GB
  (NVLink 3): on 40 GB no split fits without recomputation, on 80 GB memory slows the
  no-recomputation optimum.
* ``heterogeneous/``: multi-resource workers (issue 3) for AlexNet and GoogLeNet: 4 Jetson AGX
  Orin (CPU + GPU + DLA); mixed edge SoCs (Jetson AGX Orin, Apple M2, Apple M1, Snapdragon
  X Elite; CPU + GPU + NPU each) over 10 Gigabit Ethernet, 8 and 16 devices; CPU + GPU
  servers (A100 + EPYC 7763, T4 + Xeon 8380) at fp32 over InfiniBand EDR.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..io.native import dumps
from .build import instance

_SOC_MIX = {"jetson-agx-orin": 2, "apple-m2": 2, "apple-m1": 2, "snapdragon-x-elite": 2}
_SOC_MIX16 = {k: 2 * v for k, v in _SOC_MIX.items()}
_SERVER_MIX = {"server-a100-epyc": 2, "server-t4-xeon": 2}


def _shipped() -> list[tuple[str, dict]]:
    out = []
    for m in ("alexnet", "googlenet", "vgg16", "resnet50", "bert-large", "gpt2-xl"):
        for n in (4, 8, 16):
            out.append(
                (
                    "homogeneous",
                    {
                        "model_name": m,
                        "devices": "a100-40gb",
                        "n": n,
                        "bandwidth": "nvlink3" if n <= 8 else "ib-hdr",
                    },
                )
            )
    out += [
        ("memory", {"model_name": "gpt3-6.7b", "devices": "a100-40gb", "n": 8, "bandwidth": "nvlink3"}),
        ("memory", {"model_name": "gpt3-6.7b", "devices": "a100-40gb", "n": 16, "bandwidth": "ib-hdr"}),
        (
            "memory",
            {
                "model_name": "bert-large",
                "devices": "v100-16gb",
                "n": 4,
                "bandwidth": "nvlink2",
                "microbatch": 16,
                "name": "bert-large-mb16-v100-16gb-x4",
            },
        ),
        *(
            (
                "memory",
                {
                    "model_name": m,
                    "devices": dev,
                    "n": 8,
                    "bandwidth": "nvlink3",
                    "microbatch": mb,
                    "name": f"{m}-mb{mb}-{dev}-x8",
                },
            )
            for m, mb in (("llama-7b", 8), ("gpt2-xl", 16))
            for dev in ("a100-40gb", "a100-80gb")
        ),
        (
            "memory",
            {
                "model_name": "vgg16",
                "devices": "t4",
                "n": 8,
                "bandwidth": "pcie4",
                "microbatch": 128,
                "name": "vgg16-mb128-t4-x8",
            },
        ),
    ]
    for m in ("alexnet", "googlenet"):
        out += [
            ("heterogeneous", {"model_name": m, "devices": "jetson-agx-orin", "n": 4, "bandwidth": "10gbe"}),
            (
                "heterogeneous",
                {"model_name": m, "devices": _SOC_MIX, "bandwidth": "10gbe", "name": f"{m}-soc-mix8"},
            ),
            (
                "heterogeneous",
                {
                    "model_name": m,
                    "devices": _SERVER_MIX,
                    "bandwidth": "ib-edr",
                    "precision": "fp32",
                    "name": f"{m}-server-mix4",
                },
            ),
        ]
    out.append(
        (
            "heterogeneous",
            {
                "model_name": "googlenet",
                "devices": _SOC_MIX16,
                "bandwidth": "10gbe",
                "name": "googlenet-soc-mix16",
            },
        )
    )
    return out


SHIPPED = _shipped()
"""``list[(subdirectory, keyword arguments of pipeopt.zoo.instance)]``: the shipped set."""


def generate(out_dir: str | Path = "instances") -> list[Path]:
    """Write every instance of :data:`SHIPPED` under ``out_dir`` as native JSON.

    Parameters
    ----------
    out_dir
        Target directory; files go to ``out_dir/<subdirectory>/<instance name>.json``.
        Existing files of the same names are overwritten; other files are left alone.

    Returns
    -------
    list[Path]
        The files written, in :data:`SHIPPED` order.
    """
    out_dir = Path(out_dir)
    written = []
    for sub, kwargs in SHIPPED:
        inst = instance(**kwargs)
        path = out_dir / sub / f"{inst.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(inst))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m pipeopt.zoo [DIR]``; prints one line per file; returns 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    out = argv[0] if argv and argv[0] is not None else "instances"
    for path in generate(out):
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

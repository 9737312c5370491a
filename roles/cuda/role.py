"""cuda: the CUDA toolkit on GPU nodes (containers bring their own; this is for the host)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule, VarProblem, check_major_minor, major_minor
from gpuk8s.facts import Fact
from gpuk8s.facts.nvidia import CudaToolkits
from gpuk8s.facts.system import OsRelease, Packages, PciDevices
from gpuk8s.ops import Op, noop
from gpuk8s.ops.apt import packages
from gpuk8s.roles import HostContext
from roles.nvidia_driver.role import cuda_repo_op, driver_source


def _driver_for_cuda(values: Mapping[str, Any]) -> VarProblem | None:
    """CUDA 13 and newer need driver branch 580 or newer (when the toolkit is installed)."""
    cuda = major_minor(values.get("cuda_version"))
    branch = values.get("nvidia_driver_branch")
    if cuda and cuda[0] >= 13 and values.get("cuda_toolkit_enabled") is True \
            and isinstance(branch, str) and re.fullmatch(r"\d{3}", branch) and int(branch) < 580:
        return VarProblem(
            "cuda_version", f"CUDA {cuda[0]}.{cuda[1]} needs driver branch 580 or newer, but "
            f"nvidia_driver_branch is {branch}",
            'write cuda_version: "12.8" (or nvidia_driver_branch: "580")',
            others=("nvidia_driver_branch",))
    return None


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "cuda_version": Rule(check_major_minor, across=_driver_for_cuda),
}


def _package(vars: Mapping[str, Any]) -> str:
    return "cuda-toolkit-" + str(vars["cuda_version"]).replace(".", "-")


def _nvcc_package(vars: Mapping[str, Any]) -> str:
    """NVIDIA's package of nvcc alone, which CUDA images and hand installs often carry
    without the toolkit metapackage."""
    return "cuda-nvcc-" + str(vars["cuda_version"]).replace(".", "-")


#: NVIDIA's NCCL in its CUDA repository: one libnccl2 per NCCL and CUDA release, versioned
#: "<nccl>-1+cuda<major.minor>" (libnccl2_2.28.3-1+cuda13.0_amd64.deb)
NCCL = "libnccl2"


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [PciDevices(), OsRelease(), CudaToolkits(), Packages(_package(vars)),
            Packages(_nvcc_package(vars)), Packages(NCCL)]


def nccl_op(ctx: HostContext) -> Op:
    """The newest libnccl2 built for cuda_version (accept's all-reduce loads it), with the
    toolkit; none when cuda_nccl is false."""
    if not ctx.var("cuda_nccl"):
        return noop("cuda | NCCL", "= cuda_nccl is false")
    return packages(ctx.facts[Packages(NCCL)], "cuda | NCCL",
                    {NCCL: f"*+cuda{ctx.var('cuda_version')}"}, apt=ctx.apt)


def plan(ctx: HostContext) -> list[Op]:
    if not any(d.is_gpu for d in ctx.facts[PciDevices()]):
        return []
    if not ctx.var("cuda_toolkit_enabled"):
        return [noop("cuda | toolkit", "= cuda_toolkit_enabled is false")]
    ops = []
    if driver_source(ctx.vars, ctx.facts[OsRelease()]) != "cuda":
        ops.append(cuda_repo_op(ctx, "cuda | CUDA apt repo"))
    name = _package(ctx.vars)
    version = str(ctx.var("cuda_version"))
    present = ctx.facts[CudaToolkits()]
    if version in present and name not in ctx.facts[Packages(name)]:
        nvcc = _nvcc_package(ctx.vars)
        pkg = ctx.facts[Packages(nvcc)].get(nvcc)
        how = f"{nvcc} {pkg.version} from apt, without the {name} metapackage" if pkg else \
            "not installed with apt"
        return [noop("cuda | toolkit", f"= CUDA {present[version]} is present ({how}): left "
                     "as it is")]
    ops.append(packages(ctx.facts[Packages(name)], "cuda | toolkit",
                        {name: f"{ctx.var('cuda_version')}."}, apt=ctx.apt))
    ops.append(nccl_op(ctx))
    return ops


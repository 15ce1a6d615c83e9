"""Settle the GPU path in one command: build features, kernels for this GPU, MultiProposalTarget on the GPU,
fp16 and fp32 ResNet-101 SNIPER training, the multi-GPU gradient sum, and inference speed.

    python tools/gpu_check.py [--out gpu_check.json]     # on a GPU machine with a CUDA build of MXNet
    python tools/gpu_check.py --cpu-smoke                # the same code path on CPUs (resnet_tiny, fp32)

No dataset, checkpoint or download is needed: a few synthetic images are generated under --workdir and
the weights are random. Every part runs in its own process with a time limit, so a crash or a missing
kernel is a failed check in the report, not a dead script. It writes --out (JSON) and a Markdown report
to stdout, and exits non-zero when a check failed. Checks (docs/gpu.md has the reasoning):

  mxnet        imports; on GPUs the build has CUDA and cuDNN (NCCL is reported)
  gpus         the CUDA driver and MXNet see GPUs; name, compute capability, memory
  kernels      libmxnet.so has machine code (SASS) for GPU 0, or PTX the driver can compile (JIT, slow
               first start), or neither (a CUDA 11 wheel has no Hopper code): read from the binary itself
  first_kernel one MXNet kernel runs on GPU 0 (its time includes any JIT compilation)
  ops_gpu      the loaded operator library registers a GPU forward for MultiProposalTarget
  proposal_target  MultiProposalTarget on GPU 0 equals its CPU result on the same inputs (bit for bit)
  train_fp32, train_fp16  ITERATIONS of training on GPU 0 from the same initial weights and chips:
               losses finite and falling (the last pass over the chips below the first)
  fp16_vs_fp32 the fp16 loss curve follows fp32: the first iteration within 2 %, the mean absolute
               difference over the run within 10 % of fp32's mean loss
  gradients    with 2 or more devices: one iteration over 2 devices x CHIPS/2 gives the summed gradients
               of 1 device running the same two halves (relative difference <= 1e-3)
  inference    images/s at each TEST scale and of the merged three-scale detection, fp32 and fp16,
               TEST.BATCH_IMAGES 1, 2 and 4, end to end (host pipeline in series with the network, as
               Detector runs) and network alone (host pipeline hidden, the bound overlapping it would give)
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import sys

from lib.bootstrap import ROOT
from dev.gpu_check.report import check_plan
from dev.gpu_check.runs import PLANS, SECTIONS, run_child

PREPARE = """
Preparing a GPU machine without network (docs/gpu.md has the plan and the measured sizes):
  here:  make mxnet-gpu MXNET_SRC=DIR         # MXNet 1.9.1 with sm_90 code, CUDA 13 + cuDNN 9 (hours)
         tools/gpu_machine_prep.sh fetch      # that build's package + the ops library -> .whl/, in pieces
  there: tools/gpu_machine_prep.sh install    # reassemble, unpack, numpy 2 shim, build the extensions
         tools/gpu_machine_prep.sh check      # this script with the image's CUDA 13 libraries
         (tools/gpu_machine_prep.sh device: install + check, the report under $OUT)
A CUDA 11 wheel of MXNet 1.9.1 carries machine code for sm_50..sm_86 and no PTX: on Hopper (H100/H200,
sm_90) or newer it cannot run, which the `kernels` check reports without starting a GPU run.
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, epilog=PREPARE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="resnet_tiny, fp32, CPU contexts, a few iterations")
    parser.add_argument("--out", default="gpu_check.json", help="JSON report (default: %(default)s)")
    parser.add_argument("--workdir", default=os.path.join(ROOT, "output", "gpu_check"),
                        help="synthetic data, logs and per-run results (default: %(default)s)")
    parser.add_argument("--iterations", type=int, help="training iterations per precision (plan's default)")
    parser.add_argument("--chips", type=int, help="chips per iteration on GPU 0 (even; plan's default)")
    parser.add_argument("--budget", type=float, help="seconds for the whole check: every run stops by then "
                        "(a device lease's end); the report so far is written before each run")
    parser.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=["fp32", "fp16"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.section:
        return run_child(args.section, args.plan, args.workdir, args.result, args.precision)
    plan_name = "cpu-smoke" if args.cpu_smoke else "gpu"
    plan = dict(PLANS[plan_name])
    for key in ("iterations", "chips"):
        if getattr(args, key) is not None:
            plan[key] = getattr(args, key)
    if plan["chips"] < 2 or plan["chips"] % 2:
        parser.error(f"--chips must be an even number >= 2, got {plan['chips']}")
    if plan["iterations"] < 2 * plan["distinct_batches"]:
        parser.error(f"--iterations must be at least {2 * plan['distinct_batches']} (two passes over the chips)")
    return check_plan(plan_name, plan, os.path.abspath(args.workdir), args.out, budget=args.budget)


if __name__ == "__main__":
    sys.exit(main())

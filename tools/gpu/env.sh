# On the GPU node, after tools/gpu/install.sh: source this in the checkout before running the project.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# Keep NVLink multicast off (the machine sets these; never unset them).
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

/* Empty stand-in (see cuda_runtime.h): nccl.h includes it and uses nothing from it. */

//! The CUDA context of the calling thread.

use cudarc::driver::CudaContext;

use crate::error::{Result, drv};

/// Binds `ctx` to the calling thread.
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
}

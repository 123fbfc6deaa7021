//! Device buffers owned by the GPU side (plans, quantised operands, workspaces), allocated on the
//! GPU's own stream and handed to kernels as raw device pointers.
//!
//! The buffers are allocated and filled on [`Gpu`]'s internal stream, which is synchronised
//! before any raw pointer is handed out, so kernels on another stream (libtorch's) may use them
//! at once. Dropping a buffer while a kernel on another stream still reads it is the caller's
//! error: keep plans and saved operands alive until that stream has passed them.

use super::error::{DriverContext, GpuResult};
use super::runtime::Gpu;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use std::sync::Arc;

/// A device array of `T`.
pub struct DeviceBuf<T> {
    slice: CudaSlice<T>,
    stream: Arc<CudaStream>,
}

impl<T> std::fmt::Debug for DeviceBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuf({} x {})",
            self.slice.len(),
            std::any::type_name::<T>()
        )
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Clone + Default> DeviceBuf<T> {
    /// `n` zeroed elements (at least one, so the pointer is never null).
    pub fn zeros(gpu: &Gpu, n: usize) -> GpuResult<Self> {
        let stream = gpu.context().default_stream();
        let slice = stream.alloc_zeros::<T>(n.max(1)).ctx("cuMemAlloc")?;
        stream.synchronize().ctx("cuStreamSynchronize")?;
        Ok(DeviceBuf { slice, stream })
    }

    /// A copy of `host`.
    pub fn from_host(gpu: &Gpu, host: &[T]) -> GpuResult<Self> {
        let stream = gpu.context().default_stream();
        let slice = if host.is_empty() {
            stream.alloc_zeros::<T>(1).ctx("cuMemAlloc")?
        } else {
            stream.clone_htod(host).ctx("cuMemcpyHtoD")?
        };
        stream.synchronize().ctx("cuStreamSynchronize")?;
        Ok(DeviceBuf { slice, stream })
    }

    /// Copies the buffer back (synchronises the device first, so work on any stream is done).
    pub fn to_host(&self) -> GpuResult<Vec<T>> {
        self.stream.context().synchronize().ctx("cuCtxSynchronize")?;
        self.stream.clone_dtoh(&self.slice).ctx("cuMemcpyDtoH")
    }

    /// Overwrites the buffer with `host` (same length).
    pub fn upload(&mut self, host: &[T]) -> GpuResult<()> {
        self.stream.context().synchronize().ctx("cuCtxSynchronize")?;
        self.stream
            .memcpy_htod(host, &mut self.slice)
            .ctx("cuMemcpyHtoD")?;
        self.stream.synchronize().ctx("cuStreamSynchronize")
    }
}

impl<T> DeviceBuf<T> {
    /// The raw device pointer.
    pub fn ptr(&self) -> u64 {
        let (p, _sync) = self.slice.device_ptr(&self.stream);
        p
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True when empty (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.slice.len() * std::mem::size_of::<T>()
    }
}

//! Buffer views: a pointer, a count, a dtype and the device the memory lives on.
//!
//! Host views are made safely from slices; device views from raw pointers, unsafely, because
//! ferrocomm cannot see the allocation behind a CUDA pointer.

use std::marker::PhantomData;

use crate::types::{DataType, Device, Element};

/// A read-only buffer the collective consumes.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    ptr: *const u8,
    count: usize,
    dtype: DataType,
    device: Device,
    _life: PhantomData<&'a [u8]>,
}

/// A buffer the collective writes.
#[derive(Debug)]
pub struct ViewMut<'a> {
    ptr: *mut u8,
    count: usize,
    dtype: DataType,
    device: Device,
    _life: PhantomData<&'a mut [u8]>,
}

// SAFETY: a view is a borrowed pointer with a lifetime; moving it to another thread is as safe
// as moving the `&[T]`/`&mut [T]` it was made from (device pointers are plain addresses).
unsafe impl Send for View<'_> {}
// SAFETY: shared views only permit reads.
unsafe impl Sync for View<'_> {}
// SAFETY: as for `View`; `ViewMut` is not `Clone`, so it stays unique like `&mut [T]`.
unsafe impl Send for ViewMut<'_> {}

/// The accessors [`View`] and [`ViewMut`] share (the same fields, the pointer's mutability
/// apart).
macro_rules! view_accessors {
    () => {
        /// The number of elements.
        pub fn count(&self) -> usize {
            self.count
        }
        /// The element type.
        pub fn dtype(&self) -> DataType {
            self.dtype
        }
        /// Where the memory lives.
        pub fn device(&self) -> Device {
            self.device
        }
        /// The size in bytes: `count` times the element size.
        pub fn bytes_len(&self) -> usize {
            self.count * self.dtype.size()
        }
    };
}

impl<'a> View<'a> {
    /// A view of a host slice.
    pub fn host<T: Element>(s: &'a [T]) -> Self {
        View {
            ptr: s.as_ptr().cast(),
            count: s.len(),
            dtype: T::DTYPE,
            device: Device::Host,
            _life: PhantomData,
        }
    }

    /// A view of raw memory.
    ///
    /// # Safety
    /// `ptr` must point to `count * dtype.size()` readable bytes on `device` that stay valid and
    /// unmodified for `'a` (for CUDA: until the collective's work on its stream has finished).
    pub unsafe fn from_raw(ptr: *const u8, count: usize, dtype: DataType, device: Device) -> Self {
        View {
            ptr,
            count,
            dtype,
            device,
            _life: PhantomData,
        }
    }

    /// The first byte (a host address, or a CUDA device address).
    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }
    view_accessors!();

    /// The bytes of a host view; `None` for device memory.
    pub fn host_bytes(&self) -> Option<&'a [u8]> {
        match self.device {
            Device::Host if self.count > 0 => {
                // SAFETY: host views were made from a slice (or promised valid by `from_raw`)
                // of exactly this many bytes, borrowed for 'a.
                Some(unsafe { std::slice::from_raw_parts(self.ptr, self.bytes_len()) })
            }
            Device::Host => Some(&[]),
            Device::Cuda(_) => None,
        }
    }

    /// The elements `[start, start + len)` of this view.
    pub fn sub(&self, start: usize, len: usize) -> View<'a> {
        assert!(start + len <= self.count, "sub-view out of range");
        View {
            // SAFETY: in bounds by the assertion above (pointer arithmetic within the buffer).
            ptr: unsafe { self.ptr.add(start * self.dtype.size()) },
            count: len,
            ..*self
        }
    }
}

impl<'a> ViewMut<'a> {
    /// A view of a mutable host slice.
    pub fn host<T: Element>(s: &'a mut [T]) -> Self {
        ViewMut {
            ptr: s.as_mut_ptr().cast(),
            count: s.len(),
            dtype: T::DTYPE,
            device: Device::Host,
            _life: PhantomData,
        }
    }

    /// A view of raw writable memory.
    ///
    /// # Safety
    /// `ptr` must point to `count * dtype.size()` writable bytes on `device`, valid for `'a`,
    /// not accessed by anything else until the collective has finished with it.
    pub unsafe fn from_raw(ptr: *mut u8, count: usize, dtype: DataType, device: Device) -> Self {
        ViewMut {
            ptr,
            count,
            dtype,
            device,
            _life: PhantomData,
        }
    }

    /// The first byte (a host address, or a CUDA device address).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    view_accessors!();

    /// A read-only view of the same memory (for in-place collectives, which read their output).
    pub fn as_view(&self) -> View<'_> {
        View {
            ptr: self.ptr,
            count: self.count,
            dtype: self.dtype,
            device: self.device,
            _life: PhantomData,
        }
    }

    /// Reborrows this view for a shorter time.
    pub fn reborrow(&mut self) -> ViewMut<'_> {
        ViewMut {
            ptr: self.ptr,
            count: self.count,
            dtype: self.dtype,
            device: self.device,
            _life: PhantomData,
        }
    }

    /// The bytes of a host view; `None` for device memory.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self.device {
            Device::Host if self.count > 0 => {
                // SAFETY: host views were made from a unique slice of exactly this many bytes.
                Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes_len()) })
            }
            Device::Host => Some(&mut []),
            Device::Cuda(_) => None,
        }
    }
}

/// The input of a collective: a separate buffer, or the output buffer itself (in place).
///
/// In place follows NCCL: for `all_gather` the rank's own part already sits at its offset in the
/// output; for `reduce_scatter` the full input is the output buffer and the result is written to
/// the rank's part of it; for `all_to_all(_v)` the output holds the input and is overwritten.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// The output buffer is also the input.
    InPlace,
    /// A separate input buffer.
    Buf(View<'a>),
}

impl Input<'_> {
    /// The input's first byte as an address: its own, or the output's in place.
    pub fn address(&self, output: &ViewMut<'_>) -> u64 {
        match self {
            Input::InPlace => output.ptr() as u64,
            Input::Buf(v) => v.ptr() as u64,
        }
    }

    /// The input's address where in place means "part `rank` of `part` elements of the
    /// output" (all-gather): that part's, else its own.
    pub fn part_address(&self, output: &ViewMut<'_>, part: usize, rank: usize) -> u64 {
        match self {
            Input::InPlace => output.ptr() as u64 + (rank * part * output.dtype().size()) as u64,
            Input::Buf(v) => v.ptr() as u64,
        }
    }

    /// The reduce-scatter's (input, output, elements of a part) addresses among `size` ranks:
    /// in place the output is the whole buffer and the rank's part sits at `rank * part`;
    /// otherwise the input holds `size` parts and the output is the part.
    pub fn scatter_addresses(
        &self,
        output: &ViewMut<'_>,
        size: usize,
        rank: usize,
    ) -> (u64, u64, usize) {
        match self {
            Input::InPlace => {
                let part = output.count() / size;
                let base = output.ptr() as u64;
                (base, self.part_address(output, part, rank), part)
            }
            Input::Buf(v) => (v.ptr() as u64, output.ptr() as u64, output.count()),
        }
    }
}

impl<'a> From<View<'a>> for Input<'a> {
    fn from(v: View<'a>) -> Self {
        Input::Buf(v)
    }
}

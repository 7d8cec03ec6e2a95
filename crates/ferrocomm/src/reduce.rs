//! Host-side element arithmetic: reductions in a fixed rank order, f32 accumulation for
//! narrow float types.

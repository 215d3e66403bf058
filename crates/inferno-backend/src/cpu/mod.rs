//! The host CPU's kernels and executor. [`scalar`] is the reference every other backend is
//! checked against; [`simd`] decorates it with vector kernels picked at run time for the CPU;
//! [`parallel`] (rayon) and [`pool_backend`] (a persistent spinning [`threadpool`]) hand
//! the same kernels' shares of an operation to threads, so results are identical at any
//! thread count. The [`host`] executor runs a step's operations one after another with any
//! of them.

pub mod host;
pub mod parallel;
pub mod pool_backend;
pub mod scalar;
pub mod simd;
pub mod threadpool;

pub use parallel::ParallelBackend;
pub use pool_backend::PoolBackend;
pub use scalar::ScalarBackend;
pub use simd::SimdBackend;

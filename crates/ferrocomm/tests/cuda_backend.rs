//! CPU-side behaviour of the cuda and nccl backends: sizes, and clear errors (never panics) when
//! the NVIDIA libraries are absent.

use std::path::PathBuf;

use ferrocomm::bootstrap::MemStore;
use ferrocomm::config::BackendChoice;
use ferrocomm::{CommOptions, Communicator, Config, Device, Error};

#[test]
fn staging_memory_is_reported_per_world_size() {
    let cfg = Config::default();
    assert_eq!(cfg.cuda_staging_bytes, 64 << 20);
    let two = ferrocomm::cuda::staging_memory_bytes(&cfg, 2);
    let eight = ferrocomm::cuda::staging_memory_bytes(&cfg, 8);
    // flags 64 KiB + state 4 KiB + push 2*world*2*512 KiB + staging 2*64 MiB.
    assert_eq!(
        two,
        (64 << 10) + (4 << 10) + 2 * 2 * 2 * (512 << 10) + 2 * (64 << 20)
    );
    assert_eq!(
        eight,
        (64 << 10) + (4 << 10) + 2 * 8 * 2 * (512 << 10) + 2 * (64 << 20)
    );
    let l = ferrocomm::cuda::staging_layout(&cfg, 2);
    assert_eq!(l.staging_bytes, 64 << 20);
    assert_eq!(l.push_cap, 512 << 10);
    assert_eq!(l.staging_off % 4096, 0);
    // A small staging size also caps push.
    let small = Config {
        cuda_staging_bytes: 100_000,
        ..Config::default()
    };
    assert_eq!(ferrocomm::cuda::push_capacity(&small), 100_000);
    assert_eq!(
        ferrocomm::cuda::staging_layout(&small, 2).staging_bytes,
        102_400
    );
}

fn driver_here() -> bool {
    ferrocomm::cuda::libs::driver_present()
}

#[test]
fn no_driver_means_no_gpu_and_a_clear_error() {
    if driver_here() {
        // A GPU machine: gpu_check covers the backend there.
        return;
    }
    assert_eq!(ferrocomm::cuda::gpu_count(), 0);
    let mut o = CommOptions::new("nodriver");
    o.rank = Some(0);
    o.size = Some(1);
    o.store = Some(MemStore::new());
    o.backend = Some(BackendChoice::Cuda);
    o.device = Some(Device::Cuda(0));
    o.config = Some(Config::default());
    let e = Communicator::new(o)
        .err()
        .expect("no driver: creation must fail");
    match e {
        Error::LibraryMissing { library, .. } => assert_eq!(library, "libcuda"),
        other => panic!("expected LibraryMissing(libcuda), got {other}"),
    }
}

#[test]
fn nccl_backend_without_driver_is_a_clear_error() {
    if driver_here() {
        return;
    }
    let mut o = CommOptions::new("nccl-nodriver");
    o.rank = Some(0);
    o.size = Some(1);
    o.store = Some(MemStore::new());
    o.backend = Some(BackendChoice::Nccl);
    o.config = Some(Config::default());
    let e = Communicator::new(o)
        .err()
        .expect("must fail without libcuda");
    assert!(matches!(e, Error::LibraryMissing { .. }), "{e}");
}

#[test]
fn a_wrong_nccl_path_is_library_missing_naming_the_path() {
    let cfg = Config {
        nccl_lib: Some(PathBuf::from("/nonexistent/libnccl.so.2")),
        ..Config::default()
    };
    // probe() caches the first library it loads for the process; this test is the only one here
    // that calls it, with a path that cannot load.
    match ferrocomm::nccl::probe(&cfg) {
        Err(Error::LibraryMissing { library, why }) => {
            assert_eq!(library, "libnccl");
            assert!(why.contains("/nonexistent/libnccl.so.2"), "{why}");
        }
        other => panic!("expected LibraryMissing, got {other:?}"),
    }
}

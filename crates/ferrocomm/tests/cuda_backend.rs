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
    // flags 64 KiB + state 520 KiB (epochs, verify words, collectives' hello words and barrier
    // words for up to 8 rounds)
    // + chunk flags 2 MiB + push 2*world*2*512 KiB + staging 2*64 MiB.
    assert_eq!(
        two,
        (64 << 10) + (520 << 10) + (2 << 20) + 2 * 2 * 2 * (512 << 10) + 2 * (64 << 20)
    );
    assert_eq!(
        eight,
        (64 << 10) + (520 << 10) + (2 << 20) + 2 * 8 * 2 * (512 << 10) + 2 * (64 << 20)
    );
    let l = ferrocomm::cuda::staging_layout(&cfg, 2);
    assert_eq!(l.staging_bytes, 64 << 20);
    assert_eq!(l.push_cap, 512 << 10);
    assert_eq!(l.ll_max, 256 << 10);
    assert_eq!(l.staging_off % 4096, 0);
    // A small staging size also caps push, and LL with it.
    let mut small = Config {
        cuda_staging_bytes: 100_000,
        ..Config::default()
    };
    small.thresholds.ll_max = Some(1 << 20);
    assert_eq!(ferrocomm::cuda::push_capacity(&small), 100_000);
    let ls = ferrocomm::cuda::staging_layout(&small, 2);
    assert_eq!(ls.staging_bytes, 102_400);
    assert_eq!(ls.ll_max, 100_000);
    // FERROCOMM_LL_MAX_BYTES moves the LL limit within the push buffer.
    let lowered =
        Config::from_lookup(|k| (k == "FERROCOMM_LL_MAX_BYTES").then(|| "64K".into())).unwrap();
    assert_eq!(
        ferrocomm::cuda::staging_layout(&lowered, 2).ll_max,
        64 << 10
    );
}

#[test]
fn the_copy_engine_region_exists_only_when_asked_for_at_two_ranks() {
    let off = Config::default();
    let on =
        Config::from_lookup(|k| (k == "FERROCOMM_ALLREDUCE_CE_MIN_BYTES").then(|| "4M".into()))
            .unwrap();
    let zero =
        Config::from_lookup(|k| (k == "FERROCOMM_ALLREDUCE_CE_MIN_BYTES").then(|| "0".into()))
            .unwrap();
    assert_eq!(on.thresholds.ce_min, Some(4 << 20));
    let l = ferrocomm::cuda::staging_layout(&off, 2);
    assert_eq!(l.ce_bytes, 0);
    assert_eq!(ferrocomm::cuda::staging_layout(&zero, 2), l);
    let c = ferrocomm::cuda::staging_layout(&on, 2);
    // One staging-sized region after the two parities, nothing else moved.
    assert_eq!(c.ce_bytes, c.staging_bytes);
    assert_eq!(c.ce_off, c.staging_off + 2 * c.staging_bytes);
    assert_eq!(c.total, l.total + c.staging_bytes);
    assert_eq!((c.staging_off, c.push_off), (l.staging_off, l.push_off));
    // The kernels' words and flags take two ranks: none above.
    for world in [3, 4, 8] {
        assert_eq!(ferrocomm::cuda::staging_layout(&on, world).ce_bytes, 0);
    }
    // Which messages it takes: from the minimum up to the region, never an empty one, and none
    // without the region.
    let takes =
        |l: &ferrocomm::cuda::StagingLayout, b| ferrocomm::plan::ce_takes(l.ce_bytes, 4 << 20, b);
    assert!(!takes(&c, 0) && !takes(&c, (4 << 20) - 1));
    assert!(takes(&c, 4 << 20) && takes(&c, c.ce_bytes));
    assert!(!takes(&c, c.ce_bytes + 1));
    assert!(!takes(&l, 4 << 20) && !ferrocomm::plan::ce_takes(l.ce_bytes, 0, 1));
}

#[test]
fn the_ll128_region_holds_a_row_per_peer_and_parity_only_when_asked_for() {
    let ll = |v: &str| {
        let v = v.to_string();
        Config::from_lookup(move |k| {
            (k == "FERROCOMM_ALLREDUCE_LL128_MAX_BYTES").then(|| v.clone())
        })
        .unwrap()
    };
    let off = ferrocomm::cuda::staging_layout(&Config::default(), 2);
    assert_eq!((off.ll128_cap, off.ll128_row), (0, 0));
    assert_eq!(ferrocomm::cuda::staging_layout(&ll("0"), 2), off);
    assert!(!ferrocomm::plan::ll128_takes(off.ll128_cap, 1));
    for world in [2usize, 3, 8] {
        let base = ferrocomm::cuda::staging_layout(&Config::default(), world);
        let l = ferrocomm::cuda::staging_layout(&ll("16M"), world);
        assert_eq!(l.ll128_cap, 16 << 20);
        // Whole 128-byte lines of 120 payload bytes, rows 4 KiB apart, after everything else.
        assert!(l.ll128_row >= (16usize << 20).div_ceil(120) * 128);
        assert_eq!(l.ll128_row % 4096, 0);
        assert_eq!(l.ll128_off, base.total);
        assert_eq!(l.total, base.total + 2 * (world - 1) * l.ll128_row);
        assert_eq!(
            (l.staging_off, l.staging_bytes),
            (base.staging_off, base.staging_bytes)
        );
        // Which messages it takes: non-empty ones up to the cap.
        assert!(!ferrocomm::plan::ll128_takes(l.ll128_cap, 0));
        assert!(
            ferrocomm::plan::ll128_takes(l.ll128_cap, 1)
                && ferrocomm::plan::ll128_takes(l.ll128_cap, 16 << 20)
        );
        assert!(!ferrocomm::plan::ll128_takes(l.ll128_cap, (16 << 20) + 1));
    }
    // Never more than the staging (a larger flat message streams), and after the copy engines'
    // region when both are on.
    let big = ferrocomm::cuda::staging_layout(&ll("1G"), 2);
    assert_eq!(big.ll128_cap, big.staging_bytes);
    let both = Config::from_lookup(|k| match k {
        "FERROCOMM_ALLREDUCE_LL128_MAX_BYTES" => Some("1M".into()),
        "FERROCOMM_ALLREDUCE_CE_MIN_BYTES" => Some("4M".into()),
        _ => None,
    })
    .unwrap();
    let b = ferrocomm::cuda::staging_layout(&both, 2);
    assert_eq!(b.ll128_off, b.ce_off + b.ce_bytes);
    // An odd cap rounds up to whole words; lines cover it.
    let odd = ferrocomm::cuda::staging_layout(&ll("1001"), 2);
    assert_eq!(odd.ll128_cap, 1008);
    assert_eq!(ferrocomm::cuda::ll128_line_bytes(1008), 9 * 128);
    assert_eq!(
        ferrocomm::cuda::ll128_line_bytes(ferrocomm::cuda::LL128_PAYLOAD),
        128
    );
    assert_eq!(
        ferrocomm::cuda::ll128_line_bytes(ferrocomm::cuda::LL128_PAYLOAD + 1),
        256
    );
}

#[test]
fn copy_engine_chunks_cover_the_message_within_the_flags() {
    for bytes in [
        1usize,
        15,
        16,
        1 << 20,
        (1 << 20) + 2,
        16 << 20,
        64 << 20,
        100_000_001,
        1 << 30,
    ] {
        let c = ferrocomm::cuda::ce_chunk(bytes);
        assert_eq!(c % 16, 0, "{bytes}");
        assert!(c >= 1 << 20, "chunk {c} for {bytes}");
        let n = bytes.div_ceil(c);
        assert!(
            (1..=ferrocomm::cuda::CE_MAX_CHUNKS).contains(&n),
            "{n} chunks for {bytes}"
        );
        // About eight chunks once a message has 8 MiB (the first lands while the rest fly).
        if (8 << 20..=512 << 20).contains(&bytes) {
            assert!((7..=8).contains(&n), "{n} chunks for {bytes}");
        }
    }
}

#[test]
fn flat_chunks_fit_the_staging() {
    for &staging in &[8192usize, 102_400, 64 << 20, 256 << 20] {
        for &world in &[2usize, 3, 8, 16] {
            for &bytes in &[1usize, 2, 1000, 8192, 65_536, 1 << 20, 100 << 20, 1 << 30] {
                let (g, c) = ferrocomm::cuda::flat_grid(bytes, 132, world, staging);
                assert!((1..=132).contains(&g), "grid {g}");
                assert_eq!(c % 16, 0);
                assert!((16..=8 << 10).contains(&c), "chunk {c}");
                // Every warp's slots (world senders x 2) fit one staging parity.
                assert!(
                    g * 16 * world * 2 * c <= staging,
                    "{bytes} {world} {staging}: {g} x {c}"
                );
            }
        }
    }
    // Large messages use every SM and 8 KiB chunks per warp; 64 KiB spreads over 8 blocks of
    // 16 warps with 512 bytes each.
    assert_eq!(
        ferrocomm::cuda::flat_grid(256 << 20, 132, 2, 64 << 20),
        (132, 7936)
    );
    assert_eq!(
        ferrocomm::cuda::flat_grid(64 << 10, 132, 2, 64 << 20),
        (8, 512)
    );
}

/// Creates a one-rank communicator of `backend` on a machine where libcuda cannot be loaded
/// and returns its error. Such a machine is what these tests need: where the driver loads,
/// creation goes on to the GPU (which the GPU check programs cover), so they are ignored by a
/// plain `cargo test` and run by scripts/test.sh (its stage no-driver, on CI's machine without a
/// GPU), which fails here rather than passing on a machine with a driver.
fn create_without_driver(name: &str, backend: BackendChoice, device: Option<Device>) -> Error {
    assert!(
        !ferrocomm::cuda::libs::driver_present(),
        "libcuda loads on this machine: these tests are for a machine without the driver"
    );
    let mut o = CommOptions::new(name);
    o.rank = Some(0);
    o.size = Some(1);
    o.store = Some(MemStore::new());
    o.backend = Some(backend);
    o.device = device;
    o.config = Some(Config::default());
    Communicator::new(o)
        .err()
        .expect("no driver: creation must fail")
}

#[test]
#[ignore = "needs a machine without libcuda: scripts/test.sh runs it (stage no-driver)"]
fn no_driver_means_no_gpu_and_a_clear_error() {
    let e = create_without_driver("nodriver", BackendChoice::Cuda, Some(Device::Cuda(0)));
    assert_eq!(ferrocomm::cuda::gpu_count(), 0);
    match e {
        Error::LibraryMissing { library, why } => {
            assert_eq!(library, "libcuda");
            assert!(!why.is_empty());
        }
        other => panic!("expected LibraryMissing(libcuda), got {other}"),
    }
}

#[test]
#[ignore = "needs a machine without libcuda: scripts/test.sh runs it (stage no-driver)"]
fn nccl_backend_without_driver_is_a_clear_error() {
    let e = create_without_driver("nccl-nodriver", BackendChoice::Nccl, None);
    // NCCL needs the driver first: its absence is what is reported.
    match e {
        Error::LibraryMissing { library, .. } => assert_eq!(library, "libcuda"),
        other => panic!("expected LibraryMissing(libcuda), got {other}"),
    }
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

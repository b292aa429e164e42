//! `hatchery-shim BUNDLE_DIR`: started by the daemon, one per sandbox.
fn main() {
    let Some(bundle) = std::env::args_os().nth(1) else {
        eprintln!("usage: hatchery-shim BUNDLE_DIR");
        std::process::exit(2);
    };
    hatchery_runtime_gvisor::shim::run(std::path::Path::new(&bundle));
}

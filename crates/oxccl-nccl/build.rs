//! Gives the library NCCL's soname and puts the names clients look for
//! beside it: `libnccl.so.2` (what PyTorch and NCCL clients load).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is <target>/<profile>/build/oxccl-nccl-<hash>/out: the
    // library lands in <target>/<profile>. The link may dangle until the
    // library is linked; tests and users find it by that name.
    let Some(out) = std::env::var_os("OUT_DIR") else { return };
    let out = std::path::PathBuf::from(out);
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    let link = profile_dir.join("libnccl.so.2");
    if std::fs::symlink_metadata(&link).is_err() {
        let _ = std::os::unix::fs::symlink("libnccl.so", &link);
    }
}

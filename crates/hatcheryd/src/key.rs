use rand::RngCore;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The API key: `HATCHERY_API_KEY` if set, else the key file, else a new
/// random key written 0600 to the key file.
pub fn load_or_create(data_dir: &Path) -> std::io::Result<(String, Option<std::path::PathBuf>)> {
    if let Ok(k) = std::env::var("HATCHERY_API_KEY") {
        if !k.is_empty() {
            return Ok((k, None));
        }
    }
    let path = data_dir.join("api_key");
    if let Ok(k) = std::fs::read_to_string(&path) {
        let k = k.trim().to_string();
        if !k.is_empty() {
            return Ok((k, Some(path)));
        }
    }
    let mut raw = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut raw);
    let key: String = format!(
        "hx_{}",
        raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    f.write_all(key.as_bytes())?;
    Ok((key, Some(path)))
}

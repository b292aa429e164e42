use rand::RngCore;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// `n` random bytes as lower-case hex: the body of every secret this
/// daemon makes.
fn random_hex(n: usize) -> String {
    let mut raw = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

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
    let key = format!("hx_{}", random_hex(24));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    f.write_all(key.as_bytes())?;
    Ok((key, Some(path)))
}

/// The deployment's daemon key (hatchery_serve::headers::DAEMON_KEY_HEADER):
/// made by the first daemon to start on the state database and read from
/// it by every other, so no operator step hands it out and no client holds
/// it. On one host (SQLite) no other daemon asks for it.
pub async fn daemon_key(
    store: &dyn hatchery_store::Store,
) -> Result<String, hatchery_store::StoreError> {
    let candidate = format!("hxd_{}", random_hex(32));
    store.deployment_secret("daemon_key", &candidate).await
}

/// The secret terminal tokens are signed with: DATA_DIR/terminal_secret,
/// 32 random bytes (hex), made 0600 on first start. Deleting the file (and
/// restarting) invalidates every token not yet used.
pub fn terminal_secret(data_dir: &Path) -> std::io::Result<Vec<u8>> {
    let path = data_dir.join("terminal_secret");
    match std::fs::read_to_string(&path) {
        Ok(s) if s.trim().len() >= 32 => return Ok(s.trim().as_bytes().to_vec()),
        Ok(_) => std::fs::remove_file(&path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let secret = random_hex(32);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    f.write_all(secret.as_bytes())?;
    Ok(secret.into_bytes())
}

/// Creates the data dir and forces it to 0700 on every start, whatever
/// the role: it holds the API key (and, on a host, every sandbox's state).
pub fn prepare_data_dir(data: &std::path::Path) -> Result<(), crate::DaemonError> {
    let err = |e| crate::DaemonError::DataDir(data.to_path_buf(), e);
    std::fs::create_dir_all(data).map_err(err)?;
    std::fs::set_permissions(
        data,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
    )
    .map_err(err)
}

//! The upgrade half of an HTTP proxy: once the upstream answered `101
//! Switching Protocols`, the caller's and the upstream's connections are
//! joined and copied both ways until either side ends.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Buffer per direction when splicing an upgraded connection.
const SPLICE_BUF: usize = 64 * 1024;

/// Spawns the copy between the caller's upgrade (`down`, taken from the
/// request before it was sent) and the upstream's (taken from `resp`).
pub fn splice_upgrade<B>(down: OnUpgrade, resp: &mut hyper::Response<B>) {
    let up = hyper::upgrade::on(resp);
    tokio::spawn(async move {
        let (Ok(d), Ok(u)) = tokio::join!(down, up) else {
            return;
        };
        let _ = tokio::io::copy_bidirectional_with_sizes(
            &mut TokioIo::new(d),
            &mut TokioIo::new(u),
            SPLICE_BUF,
            SPLICE_BUF,
        )
        .await;
    });
}

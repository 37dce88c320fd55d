//! The streaming benches' baseline: `head -c <size> /dev/zero` read
//! straight from a pipe by tokio in 64 KiB reads.

use tokio::io::AsyncReadExt as _;

/// Streams `size` bytes through a pipe; returns the bytes read and the
/// number of reads (the last one finds the end).
pub async fn stream(size: u64) -> (u64, u64) {
    let mut child = tokio::process::Command::new("head")
        .args(["-c", &size.to_string(), "/dev/zero"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut delivered, mut reads) = (0u64, 0u64);
    loop {
        let n = stdout.read(&mut buf).await.unwrap();
        reads += 1;
        if n == 0 {
            break;
        }
        delivered += n as u64;
    }
    child.wait().await.unwrap();
    (delivered, reads)
}

//! A real S3 server for the gateway's tests and benchmarks: s3s-fs (the same crate family the
//! gateway is built on, used here only as an independent upstream) serving ROOT on a loopback
//! port, verifying SigV4 against one key pair. Prints `http://ADDR` on stdout once listening and
//! serves until killed.
//!
//! usage: s3-upstream ROOT ACCESS_KEY SECRET_KEY [PORT]

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use std::io::Write;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, root, access, secret, rest @ ..] = &args[..] else {
        eprintln!("usage: s3-upstream ROOT ACCESS_KEY SECRET_KEY [PORT]");
        std::process::exit(2);
    };
    let port: u16 = rest.first().map_or(Ok(0), |p| p.parse())?;
    std::fs::create_dir_all(root)?;
    let fs = s3s_fs::FileSystem::new(root).map_err(|e| format!("{e:?}"))?;
    let mut b = S3ServiceBuilder::new(fs);
    b.set_auth(SimpleAuth::from_single(access.clone(), secret.as_str()));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("http://{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let http = ConnBuilder::new(TokioExecutor::new());
    loop {
        let (socket, _) = listener.accept().await?;
        socket.set_nodelay(true)?;
        let conn = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

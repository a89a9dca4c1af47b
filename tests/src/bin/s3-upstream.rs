//! A real S3 server for the gateway's tests and benchmarks: s3s-fs (the same crate family the
//! gateway is built on, used here only as an independent upstream) serving ROOT on a loopback
//! port, verifying SigV4 against one key pair. With `--tls CERT KEY` (PEM files) it serves
//! https instead. Prints `http(s)://ADDR` on stdout once listening and serves until killed.
//!
//! usage: s3-upstream ROOT ACCESS_KEY SECRET_KEY [PORT] [--tls CERT KEY]

use std::io::Write;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

const USAGE: &str = "usage: s3-upstream ROOT ACCESS_KEY SECRET_KEY [PORT] [--tls CERT KEY]";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let tls = match args.iter().position(|a| a == "--tls") {
        Some(i) if args.len() >= i + 3 => {
            let files: Vec<String> = args.drain(i..i + 3).skip(1).collect();
            Some(acceptor(&files[0], &files[1])?)
        }
        Some(_) => return Err(USAGE.into()),
        None => None,
    };
    let [root, access, secret, rest @ ..] = &args[..] else {
        return Err(USAGE.into());
    };
    let port: u16 = rest.first().map_or(Ok(0), |p| p.parse())?;
    std::fs::create_dir_all(root)?;
    let fs = s3s_fs::FileSystem::new(root).map_err(|e| format!("{e:?}"))?;
    let mut b = S3ServiceBuilder::new(fs);
    b.set_auth(SimpleAuth::from_single(access.clone(), secret.as_str()));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("{scheme}://{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let http = ConnBuilder::new(TokioExecutor::new());
    loop {
        let (socket, _) = listener.accept().await?;
        socket.set_nodelay(true)?;
        let (http, service, tls) = (http.clone(), service.clone(), tls.clone());
        tokio::spawn(async move {
            let _ = match tls {
                Some(tls) => match tls.accept(socket).await {
                    Ok(stream) => http.serve_connection(TokioIo::new(stream), service).await,
                    Err(_) => return,
                },
                None => http.serve_connection(TokioIo::new(socket), service).await,
            };
        });
    }
}

fn acceptor(
    cert: &str,
    key: &str,
) -> Result<tokio_rustls::TlsAcceptor, Box<dyn std::error::Error>> {
    let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

//! TLS to the team store: rustls (the gateway's TLS stack) behind tokio-postgres's connector
//! traits. Used for `sslmode=require`, and then the server is always verified: its certificate
//! must chain to the system's roots, `PGSSLROOTCERT` or `~/.postgresql/root.crt` and name the
//! host (libpq's `verify-full`; roar never sends credentials to a server it has not verified). A
//! URL without `sslmode` (libpq's `prefer`) or with `sslmode=disable` connects in plain text.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use postgres::Socket;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Makes a verified TLS connection per connect.
#[derive(Clone)]
pub(crate) struct Rustls(Arc<rustls::ClientConfig>);

/// The roots a team store's certificate may chain to; the file named by `PGSSLROOTCERT` (or
/// libpq's default `~/.postgresql/root.crt`) besides the system's.
fn roots() -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let named = std::env::var_os("PGSSLROOTCERT").map(PathBuf::from);
    let default = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql/root.crt"));
    if let Some(file) = named.clone().or(default) {
        match std::fs::read(&file) {
            Ok(pem) => {
                let certs: Vec<CertificateDer<'static>> =
                    rustls_pki_pem(&pem).map_err(|e| format!("{}: {e}", file.display()))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!("{}: no certificate in it", file.display()));
                }
            }
            // Only a file the user named must exist.
            Err(e) if named.is_some() => return Err(format!("{}: {e}", file.display())),
            Err(_) => {}
        }
    }
    if roots.is_empty() {
        return Err(
            "no trusted CA certificates: install ca-certificates or name the team store's CA in PGSSLROOTCERT"
                .into(),
        );
    }
    Ok(roots)
}

/// The certificates of a PEM file.
fn rustls_pki_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file ({e:?})"))
}

impl Rustls {
    pub(crate) fn new() -> Result<Rustls, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots()?)
            .with_no_client_auth();
        Ok(Rustls(Arc::new(config)))
    }
}

impl MakeTlsConnect<Socket> for Rustls {
    type Stream = Stream;
    type TlsConnect = Connect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, Self::Error> {
        Ok(Connect {
            config: self.0.clone(),
            name: ServerName::try_from(domain.to_owned())?,
        })
    }
}

pub(crate) struct Connect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for Connect {
    type Stream = Stream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        Box::pin(async move {
            tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, socket)
                .await
                .map(|s| Stream(Box::new(s)))
        })
    }
}

pub(crate) struct Stream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl TlsStream for Stream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

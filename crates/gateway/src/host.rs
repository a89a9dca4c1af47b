//! Which bucket a request names by its Host header: `BUCKET.DOMAIN` for each configured base
//! domain is virtual-hosted style; an IP address, a base domain itself or any other name is
//! path style (s3s's own hosts would read `127.0.0.1:9000` as a bucket).

use s3s::host::{S3Host, VirtualHost};
use s3s::S3Result;

pub(crate) struct Hosts {
    domains: Vec<String>,
}

impl Hosts {
    pub(crate) fn new(domains: &[String]) -> Hosts {
        Hosts {
            domains: domains.iter().map(|d| d.to_ascii_lowercase()).collect(),
        }
    }

    /// The bucket named by `host` (a Host header, with or without a port), if any.
    pub(crate) fn bucket<'a>(&self, host: &'a str) -> Option<&'a str> {
        let name = strip_port(host);
        if name.parse::<std::net::IpAddr>().is_ok() {
            return None;
        }
        self.domains.iter().find_map(|d| {
            let lower = name.to_ascii_lowercase();
            let cut = lower.strip_suffix(d.as_str())?.strip_suffix('.')?.len();
            (cut > 0).then(|| &name[..cut])
        })
    }
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        // [::1]:9000
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

impl S3Host for Hosts {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        let vh = VirtualHost::new(host);
        Ok(match self.bucket(host) {
            Some(bucket) => vh.with_bucket(bucket),
            None => vh,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_style_for_addresses_and_bare_domains() {
        let h = Hosts::new(&["localhost".into(), "s3.example.test".into()]);
        assert_eq!(h.bucket("127.0.0.1:9000"), None);
        assert_eq!(h.bucket("[::1]:9000"), None);
        assert_eq!(h.bucket("localhost:9000"), None);
        assert_eq!(h.bucket("s3.example.test"), None);
        assert_eq!(h.bucket("otherhost:80"), None);
    }

    #[test]
    fn virtual_hosted_buckets() {
        let h = Hosts::new(&["localhost".into(), "s3.example.test".into()]);
        assert_eq!(h.bucket("data.localhost:9000"), Some("data"));
        assert_eq!(
            h.bucket("my.dotted.bucket.s3.example.test"),
            Some("my.dotted.bucket")
        );
        assert_eq!(h.bucket("Data.LOCALHOST"), Some("Data"));
        assert_eq!(h.bucket(".localhost"), None);
        assert_eq!(h.bucket("notlocalhost"), None);
    }
}

//! The service's TLS identity: a PEM certificate chain and private key, checked before the
//! server starts so that a bad file is reported as such (which file, and whether the key
//! belongs to the certificate) rather than as a bare transport error; and the same
//! identity as the HTTP listener's rustls configuration (HTTP/2 and HTTP/1.1 by ALPN).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// A PEM certificate chain and private key for TLS.
#[derive(Clone)]
pub struct TlsPem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

/// What is wrong with a [`TlsPem`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TlsError {
    #[error("the certificate file holds no PEM certificate ({0})")]
    Certificate(String),
    #[error("the key file holds no usable PEM private key ({0})")]
    Key(String),
    #[error("the private key does not match the certificate")]
    KeyMismatch,
}

impl TlsPem {
    /// Parses both files and checks that the key is the certificate's.
    pub fn check(&self) -> Result<(), TlsError> {
        let certs = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        if certs.is_empty() {
            return Err(TlsError::Certificate("no CERTIFICATE block".into()));
        }
        let key =
            PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| TlsError::Key(e.to_string()))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| TlsError::Key(e.to_string()))?;
        let certified = rustls::sign::CertifiedKey::new(certs, signing);
        match certified.keys_match() {
            Ok(()) => Ok(()),
            Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch),
            Err(e) => Err(TlsError::Certificate(e.to_string())),
        }
    }

    /// A rustls server configuration for this identity that offers HTTP/2 and HTTP/1.1.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        self.check()?;
        let certs = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        let key =
            PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| TlsError::Key(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Certificate(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Key(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/service_support/tls");
        std::fs::read(dir.join(name)).unwrap()
    }

    #[test]
    fn a_good_pair_passes_and_each_fault_is_named() {
        let good = TlsPem {
            cert: fixture("server.pem"),
            key: fixture("server.key"),
        };
        assert_eq!(good.check(), Ok(()));
        let swapped = TlsPem {
            cert: good.key.clone(),
            key: good.cert.clone(),
        };
        assert!(matches!(swapped.check(), Err(TlsError::Certificate(_))));
        let no_key = TlsPem {
            key: b"not a key".to_vec(),
            ..good.clone()
        };
        let e = no_key.check().unwrap_err();
        assert!(matches!(e, TlsError::Key(_)), "{e}");
        assert!(e.to_string().contains("key file"), "{e}");
        let other_key = fixture("other.key");
        let mismatched = TlsPem {
            key: other_key,
            ..good
        };
        assert_eq!(mismatched.check(), Err(TlsError::KeyMismatch));
    }
}

//! The Hub's HTTP client: blocking `ureq` with every redirect followed here rather than by
//! the agent, so that the access token goes only where it was given for.
//!
//! The token belongs to the Hub's origin (`HF_ENDPOINT`'s scheme, host and port). A request
//! carries it while it stays on that origin, and loses it for good at the first redirect to
//! another one, as `huggingface_hub`, curl and browsers do: the storage host a file's body is
//! redirected to never sees it, nor does any host a mirror sends us on to. ureq's own
//! redirect rule would keep it across ports of one host and from `http` to `https`, and the
//! `hf-hub` crate also sent it on a size probe at the storage host, so neither decides here.

use std::time::Duration;

use url::Url;

use super::{HubError, HubOptions};

/// Redirects followed for one request before giving up (the Hub uses one or two).
const MAX_REDIRECTS: usize = 10;

/// How far redirects are followed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Follow {
    /// Only while they stay on the first request's origin; a redirect elsewhere is the answer
    /// (the Hub's `resolve` redirect to the storage host, whose headers describe the file).
    SameOrigin,
    /// To wherever they lead.
    All,
}

/// A response and the URL that answered it.
pub(super) struct Reply {
    pub response: ureq::Response,
    pub url: Url,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.response.header(name)
    }

    /// Where a redirect answer points, resolved against the URL that gave it.
    pub fn location(&self) -> Option<Url> {
        let to = self.header("Location")?;
        self.url.join(to).ok()
    }

    pub fn is_redirect(&self) -> bool {
        is_redirect(self.response.status())
    }
}

fn is_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// The Hub's client for one set of [`HubOptions`].
pub(super) struct Client {
    agent: ureq::Agent,
    hub: Url,
    /// `Bearer <token>`, kept only here.
    authorization: Option<String>,
}

impl Client {
    pub fn new(opts: &HubOptions) -> Result<Client, HubError> {
        let hub = Url::parse(&opts.endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| HubError::Network {
                endpoint: opts.endpoint.clone(),
                error: "not an http(s) URL (check HF_ENDPOINT)".into(),
            })?;
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .try_proxy_from_env(true)
            .user_agent(concat!("inferno/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Duration::from_secs(30))
            // A body that stalls this long fails its attempt; the next resumes it.
            .timeout_read(Duration::from_secs(60))
            .build();
        Ok(Client {
            agent,
            hub,
            authorization: opts
                .token
                .as_ref()
                .map(|t| format!("Bearer {}", t.expose())),
        })
    }

    /// A URL on the Hub: the endpoint (with any path a mirror has) and then `segments`, each
    /// percent-encoded as one path segment.
    pub fn hub_url<'a>(&self, segments: impl IntoIterator<Item = &'a str>) -> Url {
        let mut url = self.hub.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Is `url` on the Hub's origin (scheme, host and port)?
    pub fn is_hub(&self, url: &Url) -> bool {
        url.origin() == self.hub.origin()
    }

    /// Sends `method url` with `headers`, following redirects as `follow` says. The token
    /// goes with it while every hop so far stayed on the Hub's origin.
    pub fn send(
        &self,
        method: &str,
        url: Url,
        headers: &[(&str, &str)],
        follow: Follow,
    ) -> Result<Reply, SendError> {
        let mut url = url;
        let mut with_token = self.is_hub(&url);
        for _ in 0..=MAX_REDIRECTS {
            let mut request = self.agent.request_url(method, &url);
            for (name, value) in headers {
                request = request.set(name, value);
            }
            if let (true, Some(auth)) = (with_token, &self.authorization) {
                request = request.set("Authorization", auth);
            }
            let response = match request.call() {
                Ok(r) => r,
                Err(ureq::Error::Status(status, response)) => {
                    return Err(SendError::Status(status, Box::new(Reply { response, url })))
                }
                Err(ureq::Error::Transport(t)) => return Err(SendError::Transport(t.to_string())),
            };
            let reply = Reply { response, url };
            let Some(next) = reply.location().filter(|_| reply.is_redirect()) else {
                return Ok(reply);
            };
            let same_origin = next.origin() == reply.url.origin();
            if follow == Follow::SameOrigin && !same_origin {
                return Ok(reply);
            }
            with_token &= same_origin;
            url = next;
        }
        Err(SendError::Transport(format!(
            "more than {MAX_REDIRECTS} redirects from {url}"
        )))
    }
}

/// A request that got no answer to use.
pub(super) enum SendError {
    /// An HTTP error status (4xx, 5xx) and who answered it.
    Status(u16, Box<Reply>),
    /// No answer: the connection, TLS, a timeout, or redirects without end.
    Transport(String),
}

impl SendError {
    /// The error a user reads, for `what` (a file, a revision) of `repo`. An answer of the
    /// Hub is read as the Hub means it (`X-Error-Code`, as `huggingface_hub` reads it); one
    /// of the storage host is only its status.
    pub fn into_hub_error(
        self,
        client: &Client,
        opts: &HubOptions,
        repo: &str,
        what: &str,
    ) -> HubError {
        match self {
            SendError::Status(status, reply) if client.is_hub(&reply.url) => {
                let code = reply.header("X-Error-Code").unwrap_or("").to_string();
                let message = reply
                    .header("X-Error-Message")
                    .map(str::to_string)
                    .unwrap_or_else(|| reply.response.status_text().to_string());
                status_error(status, &code, &message, opts, repo, what)
            }
            SendError::Status(status, reply) => HubError::Http {
                what: what.to_string(),
                status,
                message: format!(
                    "{} (from the storage host {})",
                    reply.response.status_text(),
                    reply.url.host_str().unwrap_or("")
                ),
            },
            SendError::Transport(error) => HubError::Network {
                endpoint: opts.endpoint.clone(),
                error,
            },
        }
    }
}

/// What an error status of the Hub means to the user.
pub(super) fn status_error(
    status: u16,
    code: &str,
    message: &str,
    opts: &HubOptions,
    repo: &str,
    what: &str,
) -> HubError {
    match (status, code) {
        (_, "GatedRepo") | (403, _) => HubError::Gated {
            repo: repo.to_string(),
            endpoint: opts.endpoint.clone(),
            with_token: opts.token.is_some(),
            message: message.to_string(),
        },
        (_, "RepoNotFound") | (401, _) => HubError::NotFound {
            what: format!("the repository {repo}"),
            endpoint: opts.endpoint.clone(),
            hint: if opts.token.is_some() {
                " (or the token given cannot see it)".into()
            } else {
                " (a private repository needs a token: set HF_TOKEN or pass --hf-token-file)".into()
            },
        },
        (404, _) => HubError::NotFound {
            what: what.to_string(),
            endpoint: opts.endpoint.clone(),
            hint: String::new(),
        },
        _ => HubError::Http {
            what: what.to_string(),
            status,
            message: message.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::Token;
    use super::*;
    use std::path::PathBuf;

    fn opts(endpoint: &str) -> HubOptions {
        HubOptions {
            endpoint: endpoint.into(),
            cache: PathBuf::from("/nonexistent"),
            token: Some(Token::new("hf_secret")),
            offline: false,
        }
    }

    #[test]
    fn hub_urls_keep_a_mirrors_path_and_encode_each_segment() {
        let c = Client::new(&opts("https://mirror.example/hf")).unwrap();
        let u = c.hub_url(["u", "r", "resolve", "v1/x", "a b.gguf"]);
        assert_eq!(
            u.as_str(),
            "https://mirror.example/hf/u/r/resolve/v1%2Fx/a%20b.gguf"
        );
        assert!(c.is_hub(&u));
        for other in [
            "http://mirror.example/hf/x",
            "https://mirror.example:8443/hf/x",
            "https://cdn.mirror.example/hf/x",
        ] {
            assert!(!c.is_hub(&Url::parse(other).unwrap()), "{other}");
        }
        assert!(Client::new(&opts("mirror.example")).is_err());
    }

    #[test]
    fn a_token_never_prints() {
        let o = opts("https://hub.example");
        assert!(!format!("{o:?}").contains("hf_secret"));
    }

    #[test]
    fn the_hubs_status_codes_say_what_to_do() {
        let opts = HubOptions {
            endpoint: "https://hub.example".into(),
            cache: PathBuf::from("/nonexistent"),
            token: None,
            offline: false,
        };
        let e = status_error(401, "GatedRepo", "Access restricted", &opts, "u/r", "x");
        let text = e.to_string();
        assert!(
            text.contains("u/r is gated")
                && text.contains("HF_TOKEN")
                && text.contains("--hf-token-file"),
            "{text}"
        );
        let e = status_error(401, "RepoNotFound", "", &opts, "u/r", "x").to_string();
        assert!(
            e.contains("no repository u/r") || e.contains("the repository u/r"),
            "{e}"
        );
        let e = status_error(
            404,
            "RevisionNotFound",
            "",
            &opts,
            "u/r",
            "revision v9 of u/r",
        );
        assert!(e.to_string().contains("revision v9 of u/r"), "{e}");
        let with = HubOptions {
            token: Some(Token::new("t")),
            ..opts
        };
        let e = status_error(403, "", "no access", &with, "u/r", "x").to_string();
        assert!(e.contains("the token given"), "{e}");
    }
}

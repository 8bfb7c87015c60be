//! Plain HTTP requests to the dashboard, the API and the public listener.

use std::time::Duration;

/// One HTTP answer.
#[derive(Debug)]
pub struct Http {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl Http {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request to `127.0.0.1:port` (redirects are not followed; a body is
/// sent as a form unless a Content-Type header says otherwise).
pub fn http(
    method: &str,
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Http {
    let agent = ureq::AgentBuilder::new()
        .redirects(0)
        .timeout(Duration::from_secs(20))
        .build();
    let mut req = agent.request(method, &format!("http://127.0.0.1:{port}{path}"));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let sent = match body {
        Some(b)
            if headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type")) =>
        {
            req.send_string(b)
        }
        Some(b) => req
            .set("Content-Type", "application/x-www-form-urlencoded")
            .send_string(b),
        None => req.call(),
    };
    let resp = match sent {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = resp.status();
    let headers = resp
        .headers_names()
        .into_iter()
        .flat_map(|name| {
            resp.all(&name)
                .into_iter()
                .map(|v| (name.clone(), v.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    Http {
        status,
        headers,
        body: resp.into_string().unwrap_or_default(),
    }
}

//! What the web tests share: child processes stopped by their pid, the lines
//! they print, `tenure serve` on a free loopback port, raw HTTP, and a
//! headless chromium session over WebDriver.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use tenure::Config;

/// A child process killed (by its pid) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Sends `sig` (`-STOP`, `-CONT`, ...) to the child, by its pid.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    }
}

/// The lines a child prints on its standard output, as they come.
pub fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Everything a child prints on its standard error, kept as it comes.
pub fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let err = child.stderr.take().expect("stderr");
    let text = Arc::new(Mutex::new(String::new()));
    let into = text.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut t = into.lock().unwrap();
            t.push_str(&line);
            t.push('\n');
        }
    });
    text
}

/// The first line containing `prefix`, from `prefix` on.
pub fn wait_line(rx: &mpsc::Receiver<String>, prefix: &str, within: Duration) -> String {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            // libtest prints `test child_worker ... ` before the test's own output.
            Ok(l) if l.contains(prefix) => return l[l.find(prefix).unwrap_or(0)..].to_string(),
            Ok(_) => {}
            Err(e) => panic!("no line {prefix:?} within {within:?}: {e}"),
        }
    }
}

/// A `tenure` command with the servers of `cfg` as flags and no `TENURE_*` variables.
pub fn tenure_cmd(cfg: &Config) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenure"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TENURE_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(["--nats", &cfg.nats_url, "--database-url", &cfg.database_url])
        .args(["--namespace", &cfg.namespace, "--schema", &cfg.schema]);
    cmd
}

/// A running `tenure serve`: the process, its base URL, its standard error.
pub struct Serve {
    pub proc: Proc,
    pub base: String,
    pub stderr: Arc<Mutex<String>>,
}

impl Serve {
    /// `tenure serve --bind 127.0.0.1:0 --refresh 1 <args>` with `envs`,
    /// once it says where it listens.
    pub fn start(cfg: &Config, args: &[&str], envs: &[(&str, &str)]) -> Serve {
        let mut cmd = tenure_cmd(cfg);
        cmd.args(["serve", "--bind", "127.0.0.1:0", "--refresh", "1"])
            .args(args)
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("tenure serve");
        let rx = lines_of(&mut child);
        let stderr = collect_stderr(&mut child);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let line = loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(l) if l.contains("listening on ") => break l,
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout)
                    if std::time::Instant::now() < deadline => {}
                _ => {
                    std::thread::sleep(Duration::from_millis(300));
                    panic!(
                        "tenure serve {args:?} did not start: {}",
                        stderr.lock().unwrap()
                    );
                }
            }
        };
        let base = line[line.find("listening on ").unwrap_or(0)..]
            .trim_start_matches("listening on ")
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        Serve {
            proc: Proc(child),
            base,
            stderr,
        }
    }

    /// `host:port` of the base URL.
    pub fn addr(&self) -> String {
        self.base
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .to_string()
    }

    /// What it printed on standard error so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// An HTTP answer read off a raw connection.
#[derive(Debug, Default)]
pub struct Answer {
    /// 0: the server closed the connection without an answer.
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `name=value` of the `Set-Cookie` header.
    pub fn cookie(&self) -> String {
        let c = self.header("set-cookie").expect("a cookie");
        c.split(';').next().unwrap().to_string()
    }
}

/// Parses a raw HTTP/1.1 answer.
pub fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw).to_string();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Answer::default();
    };
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// One request over a fresh connection to `addr` (`Connection: close`);
/// `head` is the request line and headers without the final blank line,
/// with `{host}` replaced by `addr`.
pub fn raw(addr: &str, head: &str, body: &[u8]) -> Answer {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    exchange(&mut s, addr, head, body)
}

/// Writes the request to `s` and reads the answer until the server closes.
pub fn exchange<S: Read + Write>(s: &mut S, addr: &str, head: &str, body: &[u8]) -> Answer {
    let head = head.replace("{host}", addr);
    let mut req = format!("{head}\r\nConnection: close\r\n");
    if !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    if s.write_all(&bytes).is_err() {
        return Answer::default();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse_answer(&out)
}

/// `GET path` with `Host: addr`.
pub fn get(addr: &str, path: &str) -> Answer {
    raw(addr, &format!("GET {path} HTTP/1.1\r\nHost: {{host}}"), b"")
}

/// `GET path` with `Host: addr` and the extra `headers` (each ending in `\r\n`).
pub fn get_with(addr: &str, path: &str, headers: &str) -> Answer {
    let head = format!("GET {path} HTTP/1.1\r\nHost: {{host}}\r\n{headers}");
    raw(addr, head.trim_end(), b"")
}

/// A form POST with `Host: addr` and the extra `headers` (each ending in `\r\n`).
pub fn post(addr: &str, path: &str, headers: &str, form: &str) -> Answer {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {{host}}\r\n{headers}Content-Type: application/x-www-form-urlencoded"
    );
    let body = if form.is_empty() {
        b"".as_slice()
    } else {
        form.as_bytes()
    };
    if body.is_empty() {
        return raw(addr, &format!("{head}\r\nContent-Length: 0"), b"");
    }
    raw(addr, &head, body)
}

/// chromedriver on a free loopback port, and a headless chromium session
/// started with the extra chromium `args`.
pub async fn browser_with(args: &[&str]) -> (Proc, Browser) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let driver = Proc(
        Command::new("chromedriver")
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (scripts/setup.sh installs chromium-driver)"),
    );
    let profile = tempfile::tempdir().unwrap().keep();
    let mut chrome_args = vec![
        "--headless=new".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-dev-shm-usage".into(),
        "--window-size=1280,900".into(),
        format!("--user-data-dir={}", profile.display()),
    ];
    chrome_args.extend(args.iter().map(|a| a.to_string()));
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "binary": "/usr/bin/chromium", "args": chrome_args }),
    );
    if args.contains(&"--ignore-certificate-errors") {
        caps.insert("acceptInsecureCerts".into(), serde_json::json!(true));
    }
    let url = format!("http://127.0.0.1:{port}");
    let mut last = None;
    for _ in 0..50 {
        let mut builder =
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
        match builder.capabilities(caps.clone()).connect(&url).await {
            Ok(c) => return (driver, c),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no WebDriver session from chromedriver at {url}: {last:?}");
}

/// A headless chromium session with the default arguments.
pub async fn browser() -> (Proc, Browser) {
    browser_with(&[]).await
}

/// Logs `b` in on `base`'s login form with `token`, then gives the redirect
/// half a second.
pub async fn log_in(b: &Browser, base: &str, token: &str) {
    b.goto(&format!("{base}/login")).await.unwrap();
    b.find(Locator::Css("#login input[name=token]"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    b.find(Locator::Css("#login button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
}

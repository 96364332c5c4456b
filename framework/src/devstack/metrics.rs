//! etcd's own request counters, read from each member's `/metrics` (plain
//! HTTP on the client port; a stack started with `tls` is not read), for
//! benchmarks and tests that count what a workload costs etcd.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::DevStack;

impl DevStack {
    /// Unary gRPC requests all etcd members have handled so far (ranges,
    /// txns, puts, deletes, lease grants and revokes; keepalives and watches
    /// are streams and not counted): the sum of etcd's
    /// `grpc_server_handled_total{grpc_type="unary"}`.
    ///
    /// # Errors
    /// A member that cannot be reached, or a stack started with `tls`.
    pub async fn etcd_unary_requests(&self) -> std::io::Result<u64> {
        if self.tls.is_some() {
            return Err(std::io::Error::other(
                "etcd metrics are read over plain HTTP only",
            ));
        }
        let mut total = 0;
        for port in &self.etcd_client_ports {
            total += unary_handled(&scrape(*port).await?);
        }
        Ok(total)
    }
}

/// `GET /metrics` from the member on `port`.
async fn scrape(port: u16) -> std::io::Result<String> {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    conn.read_to_end(&mut body).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The sum of `grpc_server_handled_total` over unary methods in a scrape.
fn unary_handled(scrape: &str) -> u64 {
    scrape
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{") && l.contains("grpc_type=\"unary\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unary_requests_are_summed() {
        let text = "# HELP x\n\
            grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 12\n\
            grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3\n\
            grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 7\n\
            grpc_server_started_total{grpc_method=\"Txn\",grpc_type=\"unary\"} 99\n";
        assert_eq!(unary_handled(text), 15);
    }
}

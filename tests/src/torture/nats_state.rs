//! What NATS knows of a lost job: the work stream's and its type consumer's
//! state, and every stored message that names the job (its sequence, subject
//! and headers). A lost job is one whose message the broker neither
//! redelivers nor dead-letters: this says whether the message is still
//! stored, and whether the consumer would ever deliver it again.

use async_nats::jetstream;
use futures::StreamExt;
use tenure::blocks::queue::headers;
use tenure::{Client, JobId};

/// How many stored messages the scan reads at the most.
const SCAN_LIMIT: u64 = 20_000;

/// Prints the stream, the consumers and the stored messages naming `id`.
pub async fn dump(client: &Client, nats_url: &str, id: JobId) {
    let servers: Vec<&str> = nats_url.split(',').collect();
    let nats = match async_nats::connect(servers).await {
        Ok(n) => n,
        Err(e) => return eprintln!("torture: lost {id}: nats unreachable: {e}"),
    };
    let js = jetstream::new(nats);
    let names = client.queue().names();
    let mut stream = match js.get_stream(&names.stream).await {
        Ok(s) => s,
        Err(e) => return eprintln!("torture: lost {id}: no stream {}: {e}", names.stream),
    };
    match stream.info().await {
        Ok(info) => eprintln!("torture: lost {id}: stream state {:?}", info.state),
        Err(e) => eprintln!("torture: lost {id}: stream info failed: {e}"),
    }
    consumers(&stream, id).await;
    scan_all(&stream, id).await;
    match js.get_stream(&names.dlq_stream).await {
        Ok(dlq) => scan_all(&dlq, id).await,
        Err(e) => eprintln!("torture: lost {id}: no stream {}: {e}", names.dlq_stream),
    }
}

/// Every stored message of `stream` (up to [`SCAN_LIMIT`]) that names `id`.
async fn scan_all(stream: &jetstream::stream::Stream, id: JobId) {
    let mut stream = stream.clone();
    if let Ok(info) = stream.info().await {
        let (first, last) = (info.state.first_sequence, info.state.last_sequence);
        eprintln!("torture: lost {id}: scanning {}", info.config.name);
        scan(
            &stream,
            id,
            first,
            last.min(first.saturating_add(SCAN_LIMIT)),
        )
        .await;
    }
}

/// Each consumer's delivered and ack floor sequences and pending counts.
async fn consumers(stream: &jetstream::stream::Stream, id: JobId) {
    let mut list = stream.consumers();
    while let Some(info) = list.next().await {
        match info {
            Ok(c) => eprintln!(
                "torture: lost {id}: consumer {} delivered={:?} ack_floor={:?} \
                 num_pending={} num_ack_pending={} num_redelivered={} num_waiting={}",
                c.name,
                c.delivered,
                c.ack_floor,
                c.num_pending,
                c.num_ack_pending,
                c.num_redelivered,
                c.num_waiting
            ),
            Err(e) => eprintln!("torture: lost {id}: consumer list failed: {e}"),
        }
    }
}

/// The stored messages in `first..=last` whose job id header is `id`.
async fn scan(stream: &jetstream::stream::Stream, id: JobId, first: u64, last: u64) {
    let needle = id.to_string();
    let mut found = 0;
    for seq in first..=last {
        let Ok(msg) = stream.get_raw_message(seq).await else {
            continue;
        };
        let names_job = msg
            .headers
            .get(headers::JOB_ID)
            .is_some_and(|v| v.as_str() == needle);
        if names_job {
            found += 1;
            eprintln!(
                "torture: lost {id}: stored seq={seq} subject={} time={} headers={:?}",
                msg.subject, msg.time, msg.headers
            );
        }
    }
    eprintln!("torture: lost {id}: {found} stored message(s) name the job (seq {first}..={last})");
}

/// How many of the server log's warnings and errors [`server_log`] prints.
const LOG_TAIL: usize = 60;

/// The last warnings and errors in nats-server's log (`[WRN]`, `[ERR]`):
/// what the server said of a consumer that stopped delivering.
pub fn server_log(path: &std::path::Path) {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return eprintln!("torture: nats log {}: {e}", path.display()),
    };
    let noted: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("[WRN]") || l.contains("[ERR]"))
        .collect();
    eprintln!(
        "torture: nats log {}: {} warning/error line(s), the last {LOG_TAIL}:",
        path.display(),
        noted.len()
    );
    for line in &noted[noted.len().saturating_sub(LOG_TAIL)..] {
        eprintln!("torture: nats log: {line}");
    }
}

// A fence read off the wire or a row is an observation: it compares with tokens,
// and `claim` / `begin_step` do not take it.
use tenure::blocks::fence::FenceStore;
use tenure::blocks::queue::headers::read_fence;
use tenure::{JobId, ObservedFence, StepIndex};

async fn replay(store: &FenceStore, headers: &async_nats::HeaderMap) {
    let (job, seen) = read_fence(headers).unwrap();
    let _ = store.claim(job, seen).await;

    let row = store.job(job).await.unwrap().unwrap();
    let fence = ObservedFence::new(row.fence).unwrap();
    let _ = store.begin_step(job, fence, StepIndex::new(0)).await;

    let forged: ObservedFence = serde_json::from_str("9223372036854775807").unwrap();
    let _ = store.claim_and_begin(JobId::from_key("t", "k"), forged.into()).await;
}

fn main() {
    let _ = replay;
}

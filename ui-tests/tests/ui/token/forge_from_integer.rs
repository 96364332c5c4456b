// A fencing token forged from any integer would fence a job out forever
// (`claim(id, i64::MAX)`): none of these doors exists.
use tenure::blocks::fence::FenceStore;
use tenure::{FencingToken, JobId, StepIndex};

async fn forge(store: &FenceStore, id: JobId) {
    let from_wire = FencingToken::from_wire(i64::MAX).unwrap();
    let _ = store.claim(id, from_wire).await;

    let converted = FencingToken::try_from(i64::MAX).unwrap();
    let _ = store.claim(id, converted).await;

    let parsed: FencingToken = serde_json::from_str("9223372036854775807").unwrap();
    let _ = store.begin_step(id, parsed, StepIndex::new(0)).await;
}

fn main() {
    let _ = forge;
}

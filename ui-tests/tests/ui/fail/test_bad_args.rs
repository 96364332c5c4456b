#[tenure::test(ttl_secs = 0)]
async fn zero_ttl(env: TestEnv) {
    let _ = env;
}

#[tenure::test(colour = "blue", own_stack, own_stack)]
async fn unknown_and_duplicate(env: TestEnv) {
    let _ = env;
}

#[tenure::test(worker = "workers")]
async fn worker_not_a_path(env: TestEnv) {
    let _ = env;
}

#[tenure::test(ttl_secs)]
async fn ttl_without_value(env: TestEnv) {
    let _ = env;
}

#[tenure::test(partitions = 0)]
async fn zero_partitions(env: TestEnv) {
    let _ = env;
}

fn main() {}

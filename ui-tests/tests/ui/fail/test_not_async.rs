#[tenure::test]
fn not_async(env: TestEnv) {
    let _ = env;
}

fn main() {}

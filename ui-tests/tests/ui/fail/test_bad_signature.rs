#[tenure::test]
async fn no_env() {}

#[tenure::test]
async fn two_args(env: TestEnv, other: u32) {
    let _ = (env, other);
}

#[tenure::test]
async fn generic<T>(env: TestEnv) {
    let _ = env;
}

#[tenure::test]
#[test]
async fn twice(env: TestEnv) {
    let _ = env;
}

fn main() {}

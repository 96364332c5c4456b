pub struct Job1;

#[tenure::job(name = "t.empty")]
impl Job1 {
    // Forgot the #[step] markers.
    async fn first(&self) {}
}

fn main() {}

#[tenure::job(name = "t.struct")]
pub struct Transfer {
    pub fee: u64,
}

#[tenure::job(name = "t.fn")]
async fn transfer() {}

fn main() {}

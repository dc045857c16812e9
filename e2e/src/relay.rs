//! A TCP relay on 127.0.0.1 that a test can cut and restore: every connection through it
//! is dropped at once and new ones are closed as they come, as when the network to a
//! server (the API server, say) goes away and comes back.

use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    /// Where clients connect.
    pub address: SocketAddr,
    open: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays 127.0.0.1:<free port> to `target`, open. Runs on the current runtime.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a relay");
        let address = listener.local_addr().expect("relay address");
        let (open, _) = watch::channel(true);
        let gate = open.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !*gate.borrow() {
                    continue; // dropped: closed at once
                }
                tokio::spawn(relay(client, target, gate.subscribe()));
            }
        });
        Relay {
            address,
            open,
            task,
        }
    }

    /// Drops every connection and closes new ones until [`Relay::restore`].
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    pub fn restore(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

async fn relay(mut client: TcpStream, target: SocketAddr, mut open: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut client, &mut server) => {}
        _ = open.wait_for(|open| !open) => {}
    }
}

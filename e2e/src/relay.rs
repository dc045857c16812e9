//! A TCP relay on 127.0.0.1 that a test can cut and restore: every connection through it
//! is dropped at once and new ones are closed as they come, as when the network to a
//! server (the API server, say) goes away and comes back. It can also point new
//! connections at another server, as when a client reconnects to another replica, and
//! make them slow towards the client, as a congested link is: messages that a fast link
//! delivers a millisecond apart then arrive a good while apart, and what a client does
//! between them shows.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, copy};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Where new connections go, and how fast the server's bytes reach the client.
#[derive(Clone, Copy)]
struct Route {
    target: SocketAddr,
    /// Bytes per second from the server to the client; None: as fast as they come.
    to_client: Option<u32>,
}

pub struct Relay {
    /// Where clients connect.
    pub address: SocketAddr,
    open: watch::Sender<bool>,
    route: watch::Sender<Route>,
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
        let (route, _) = watch::channel(Route {
            target,
            to_client: None,
        });
        let gate = open.clone();
        let routes = route.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !*gate.borrow() {
                    continue; // dropped: closed at once
                }
                tokio::spawn(relay(client, *routes.borrow(), gate.subscribe()));
            }
        });
        Relay {
            address,
            open,
            route,
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

    /// New connections go to `target`; those open stay where they are.
    pub fn redirect(&self, target: SocketAddr) {
        self.route.send_modify(|route| route.target = target);
    }

    /// New connections carry the server's bytes to the client at `bytes_per_second`
    /// (None: as fast as they come).
    pub fn slow_to_client(&self, bytes_per_second: Option<u32>) {
        self.route
            .send_modify(|route| route.to_client = bytes_per_second.map(|b| b.max(1)));
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

async fn relay(client: TcpStream, route: Route, mut open: watch::Receiver<bool>) {
    let Ok(server) = TcpStream::connect(route.target).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::select! {
        _ = copy(&mut client_read, &mut server_write) => {}
        _ = copy_at(&mut server_read, &mut client_write, route.to_client) => {}
        _ = open.wait_for(|open| !open) => {}
    }
}

/// Copies `from` to `to` until either ends, at most `rate` bytes a second.
async fn copy_at(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    rate: Option<u32>,
) -> std::io::Result<()> {
    let Some(rate) = rate else {
        copy(from, to).await?;
        return Ok(());
    };
    // Small chunks, so that a message's last byte comes when the rate says.
    let mut buffer = vec![0; (rate as usize / 100).clamp(1, 16 * 1024)];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        to.write_all(&buffer[..read]).await?;
        tokio::time::sleep(Duration::from_secs_f64(read as f64 / f64::from(rate))).await;
    }
}

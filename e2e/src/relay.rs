//! A TCP relay on 127.0.0.1 that a test can cut and restore: every connection through it
//! is dropped at once and new ones are closed as they come, as when the network to a
//! server (the API server, say) goes away and comes back. It can also point new
//! connections at another server, as when a client reconnects to another replica, and
//! make them slow towards the client, as a congested link is: messages that a fast link
//! delivers a millisecond apart then arrive a good while apart, and what a client does
//! between them shows. Stalled, it keeps every connection open and carries nothing, as
//! a black hole on the way does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
    /// One valve per stall: a connection flows while the valve it was made under is
    /// open. The last is the one new connections get.
    valves: Arc<Mutex<Vec<watch::Sender<bool>>>>,
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
        let valves = Arc::new(Mutex::new(vec![watch::channel(true).0]));
        let gate = open.clone();
        let current = valves.clone();
        let routes = route.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !*gate.borrow() {
                    continue; // dropped: closed at once
                }
                let flowing = lock(&current).last().map(watch::Sender::subscribe);
                let Some(flowing) = flowing else {
                    continue;
                };
                tokio::spawn(relay(client, *routes.borrow(), gate.subscribe(), flowing));
            }
        });
        Relay {
            address,
            open,
            valves,
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

    /// Carries nothing more, either way, on the connections open and those made from now
    /// on, and drops none, until [`Relay::unstall`] (or, for new connections,
    /// [`Relay::carry_new_connections`]): what is sent meanwhile waits.
    pub fn stall(&self) {
        for valve in lock(&self.valves).iter() {
            valve.send_replace(false);
        }
    }

    /// Connections made from now on are carried; those stalled stay stalled.
    pub fn carry_new_connections(&self) {
        lock(&self.valves).push(watch::channel(true).0);
    }

    /// Every connection is carried again.
    pub fn unstall(&self) {
        for valve in lock(&self.valves).iter() {
            valve.send_replace(true);
        }
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

async fn relay(
    client: TcpStream,
    route: Route,
    mut open: watch::Receiver<bool>,
    flowing: watch::Receiver<bool>,
) {
    let Ok(server) = TcpStream::connect(route.target).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::select! {
        _ = carry(&mut client_read, &mut server_write, None, flowing.clone()) => {}
        _ = carry(&mut server_read, &mut client_write, route.to_client, flowing) => {}
        _ = open.wait_for(|open| !open) => {}
    }
}

/// Copies `from` to `to` until either ends, at most `rate` bytes a second, holding what
/// it read while `flowing` says no.
async fn carry(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    rate: Option<u32>,
    mut flowing: watch::Receiver<bool>,
) -> std::io::Result<()> {
    // Small chunks at a rate, so that a message's last byte comes when the rate says.
    let size = rate.map_or(16 * 1024, |rate| (rate as usize / 100).clamp(1, 16 * 1024));
    let mut buffer = vec![0; size];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        if flowing.wait_for(|flowing| *flowing).await.is_err() {
            return Ok(());
        }
        to.write_all(&buffer[..read]).await?;
        if let Some(rate) = rate {
            tokio::time::sleep(Duration::from_secs_f64(read as f64 / f64::from(rate))).await;
        }
    }
}

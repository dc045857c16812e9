//! A WebSocket client through Envoy: connects to an Envoy listener for a host, sends text
//! messages and reads the backend's answers (see [`crate::WEBSOCKET_PATH`]).

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Every connect, send and read is bounded by this.
const STEP: Duration = Duration::from_secs(5);

pub struct WebSocket {
    stream: tokio_tungstenite::WebSocketStream<TcpStream>,
}

impl WebSocket {
    /// Opens a WebSocket to `host` through the Envoy listener at `target` ("ip:port" or
    /// "http://ip:port").
    pub async fn connect(target: &str, host: &str) -> Result<WebSocket, String> {
        let address = target.trim_start_matches("http://");
        let tcp = timeout(STEP, TcpStream::connect(address))
            .await
            .map_err(|_| format!("connect to {address}: timed out"))?
            .map_err(|e| format!("connect to {address}: {e}"))?;
        let request = format!("ws://{host}{}", crate::WEBSOCKET_PATH)
            .into_client_request()
            .map_err(|e| format!("request for {host}: {e}"))?;
        let (stream, _) = timeout(STEP, tokio_tungstenite::client_async(request, tcp))
            .await
            .map_err(|_| format!("upgrade through {address}: timed out"))?
            .map_err(|e| format!("upgrade through {address}: {e}"))?;
        Ok(WebSocket { stream })
    }

    /// Sends `text` and returns the answer ("backend: text"), or why there was none.
    pub async fn echo(&mut self, text: &str) -> Result<String, String> {
        timeout(STEP, self.stream.send(Message::text(text)))
            .await
            .map_err(|_| "send: timed out".to_owned())?
            .map_err(|e| format!("send: {e}"))?;
        loop {
            match timeout(STEP, self.stream.next()).await {
                Err(_) => return Err("read: timed out".into()),
                Ok(None) => return Err("read: the connection ended".into()),
                Ok(Some(Err(e))) => return Err(format!("read: {e}")),
                Ok(Some(Ok(Message::Text(answer)))) => return Ok(answer.as_str().to_owned()),
                Ok(Some(Ok(Message::Close(frame)))) => {
                    return Err(format!("read: closed {frame:?}"));
                }
                Ok(Some(Ok(_))) => continue,
            }
        }
    }
}

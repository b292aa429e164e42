// The live room's connection: the Yjs sync and awareness protocols over
// the daemon's WebSocket (`…/room`, subprotocol hatchery.room), the
// capability token offered as the subprotocol `hatchery.token.<token>`
// (a browser cannot set a header on a WebSocket). Reconnects with backoff
// and resyncs from the server's document; type 100 carries the room's own
// events (Run output, pairing).
import * as syncProtocol from "y-protocols/sync";
import * as awarenessProtocol from "y-protocols/awareness";
import * as encoding from "lib0/encoding";
import * as decoding from "lib0/decoding";

const SYNC = 0;
const AWARENESS = 1;
const EVENT = 100;
// Close codes after which reconnecting cannot help.
const FINAL = new Set([4401, 4403]);

export function connectRoom({ url, token, doc, awareness, onEvent, onStatus, onSynced }) {
  const me = {};
  let ws = null;
  // Resolvers waiting for the server's next sync step 2 (see flush).
  let waiting = [];
  let backoff = 250;
  const send = (enc) => {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(encoding.toUint8Array(enc));
  };
  doc.on("update", (update, origin) => {
    if (origin === me) return;
    const e = encoding.createEncoder();
    encoding.writeVarUint(e, SYNC);
    syncProtocol.writeUpdate(e, update);
    send(e);
  });
  awareness.on("update", ({ added, updated, removed }, origin) => {
    if (origin === "remote") return;
    const e = encoding.createEncoder();
    encoding.writeVarUint(e, AWARENESS);
    encoding.writeVarUint8Array(e, awarenessProtocol.encodeAwarenessUpdate(awareness, added.concat(updated, removed)));
    send(e);
  });
  function open() {
    ws = new WebSocket(url, ["hatchery.room", `hatchery.token.${token}`]);
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      backoff = 250;
      onStatus("live");
      const e = encoding.createEncoder();
      encoding.writeVarUint(e, SYNC);
      syncProtocol.writeSyncStep1(e, doc);
      send(e);
      if (awareness.getLocalState() !== null) {
        const a = encoding.createEncoder();
        encoding.writeVarUint(a, AWARENESS);
        encoding.writeVarUint8Array(a, awarenessProtocol.encodeAwarenessUpdate(awareness, [doc.clientID]));
        send(a);
      }
    };
    ws.onmessage = (m) => {
      const d = decoding.createDecoder(new Uint8Array(m.data));
      const type = decoding.readVarUint(d);
      if (type === SYNC) {
        const e = encoding.createEncoder();
        encoding.writeVarUint(e, SYNC);
        const t = syncProtocol.readSyncMessage(d, e, doc, me);
        if (encoding.length(e) > 1) send(e);
        if (t === syncProtocol.messageYjsSyncStep2) {
          onSynced();
          const w = waiting;
          waiting = [];
          for (const r of w) r();
        }
      } else if (type === AWARENESS) {
        awarenessProtocol.applyAwarenessUpdate(awareness, decoding.readVarUint8Array(d), "remote");
      } else if (type === EVENT) {
        onEvent(JSON.parse(new TextDecoder().decode(decoding.readVarUint8Array(d))));
      }
    };
    ws.onclose = (ev) => {
      if (FINAL.has(ev.code)) {
        onStatus(`closed: ${ev.reason || ev.code}`);
        return;
      }
      onStatus("reconnecting");
      setTimeout(open, backoff);
      backoff = Math.min(backoff * 2, 5000);
    };
  }
  open();
  // Resolves once the server has taken every update sent so far: it
  // handles one connection's messages in order, so its answer to a sync
  // step 1 sent now comes after all of them. Run and Submit wait for it,
  // since the server runs its own copy. Gives up after 3 s.
  me.flush = () =>
    new Promise((resolve) => {
      waiting.push(resolve);
      setTimeout(resolve, 3000);
      const e = encoding.createEncoder();
      encoding.writeVarUint(e, SYNC);
      syncProtocol.writeSyncStep1(e, doc);
      send(e);
    });
  // For tests: drop the socket as a network loss would.
  me.drop = () => ws && ws.close();
  return me;
}

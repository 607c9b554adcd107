// The console's connection: auth, requests, the watch, reconnect with the cursor.

export class Connection {
  constructor(onEvent, onState) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.pending = new Map();
    this.nextId = 1;
    this.ws = null;
    this.cursor = null;
    this.retry = 500;
    this.stopped = false;
  }

  open(token) {
    return new Promise((resolve, reject) => {
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const ws = new WebSocket(`${scheme}://${location.host}/console/ws`);
      this.ws = ws;
      let authed = false;
      ws.onopen = () => {
        ws.send(JSON.stringify({ jsonrpc: "2.0", id: 0, method: "console.auth", params: { token } }));
      };
      ws.onmessage = (ev) => {
        const msg = JSON.parse(ev.data);
        if (!authed) {
          if (msg.result && msg.result.authenticated) {
            authed = true;
            this.retry = 500;
            resolve(msg.result);
          } else {
            reject(new Error((msg.error && msg.error.message) || "refused"));
          }
          return;
        }
        this.dispatch(msg);
      };
      ws.onclose = (ev) => {
        for (const [, p] of this.pending) p.reject(new Error("connection closed"));
        this.pending.clear();
        if (!authed) {
          reject(new Error(ev.code === 4401 ? "invalid bearer token" : "cannot connect"));
          return;
        }
        if (this.stopped) return; // closed by the page (sign out): not a drop
        this.onState("down");
        this.onDrop();
      };
      ws.onerror = () => {};
    });
  }

  dispatch(msg) {
    if (msg.method === "bridge.event") {
      const p = msg.params;
      // every event's cursor, the watch's own too: a reset's live event carries the one to
      // watch on from (the page kept its old one, too old or of another process, until a
      // later event came, and a connection dropped meanwhile was reset again)
      if (p.cursor) this.cursor = p.cursor;
      this.onEvent(p);
      return;
    }
    if (msg.method) return; // session.update of a turn started elsewhere: not ours
    const p = this.pending.get(msg.id);
    if (!p) return;
    this.pending.delete(msg.id);
    if (msg.error) p.reject(Object.assign(new Error(msg.error.message), { code: msg.error.code }));
    else p.resolve(msg.result);
  }

  call(method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
        reject(new Error("not connected"));
        return;
      }
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params: params || {} }));
    });
  }

  watch(since) {
    if (since) this.cursor = since;
    // a streaming watch: events arrive as bridge.event notifications; it returns when it ends
    this.call("bridge.watch", this.cursor ? { since: this.cursor } : {}).then(
      (res) => {
        if (res && res.cursor) this.cursor = res.cursor;
        if (!this.stopped && this.ws && this.ws.readyState === WebSocket.OPEN) this.watch();
      },
      () => {},
    );
  }

  close() {
    this.stopped = true;
    if (this.ws) this.ws.close();
  }
}

// The playground: posts the form, reads the portal's event stream (fetch + ReadableStream)
// and writes the answer as it arrives. Events: start, delta {text}, refusal {status, code,
// message, retry_after, request_id}, error {message}, done {usage, finish, request_id}.
(() => {
  const form = document.querySelector("form[data-playground]");
  if (!form) return;
  const output = document.getElementById("playground-output");
  const state = document.getElementById("playground-state");
  const refusal = document.getElementById("playground-refusal");
  const button = form.querySelector("button[type=submit]");

  const say = (text) => { state.textContent = text; };
  const refuse = (lines) => {
    refusal.replaceChildren(...lines.map((line) => {
      const p = document.createElement("p");
      p.textContent = line;
      return p;
    }));
    refusal.hidden = false;
  };
  const describe = (r) => {
    const lines = [];
    const what = r.status === 429 ? "Rate limited" : r.code === "guardrail_blocked" ? "Blocked by a guardrail" : "Refused";
    lines.push(`${what}: HTTP ${r.status}${r.code ? " (" + r.code + ")" : ""}.`);
    if (r.message) lines.push(r.message);
    if (r.retry_after) lines.push(`Retry-After: ${r.retry_after} s — your code should wait that long before trying again.`);
    if (r.request_id) lines.push(`Request id: ${r.request_id}`);
    return lines;
  };
  const handle = (name, data) => {
    if (name === "start") say("Answering…");
    else if (name === "delta") output.textContent += data.text;
    else if (name === "refusal") { refuse(describe(data)); say("The gateway refused the request."); }
    else if (name === "error") { refuse([data.message]); say("The playground could not reach the gateway."); }
    else if (name === "done") {
      const usage = data.usage ? ` ${data.usage.prompt_tokens} prompt + ${data.usage.completion_tokens} answer tokens.` : "";
      say(`Done${data.finish ? " (" + data.finish + ")" : ""}.${usage}${data.request_id ? " Request id: " + data.request_id : ""}`);
    }
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    output.textContent = "";
    refusal.hidden = true;
    refusal.replaceChildren();
    button.disabled = true;
    say("Sending…");
    try {
      const body = new FormData(form);
      const response = await fetch(form.action, {
        method: "POST",
        body,
        headers: { "X-CSRFToken": body.get("csrfmiddlewaretoken") },
        credentials: "same-origin",
      });
      if (!response.ok) {
        refuse([`HTTP ${response.status}: ${await response.text()}`]);
        say("The portal refused the request.");
        return;
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let name = "message";
          let data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) name = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          handle(name, data ? JSON.parse(data) : {});
        }
      }
    } catch (error) {
      refuse([`The answer could not be read: ${error}`]);
      say("Something went wrong.");
    } finally {
      button.disabled = false;
    }
  });
})();

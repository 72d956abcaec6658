// The text-in-images tab: an uploaded or pasted picture goes, as its own bytes, to the `ocr`
// pipeline in one KServe v2 binary-tensor request; the boxes are drawn over the picture and the
// lines listed with their scores.

import { call } from "./api.js";

const $ = (id) => document.getElementById(id);

export class Ocr {
  constructor() {
    this.seq = 0; // uploads may overlap: only the latest answer is shown
    $("ocr-upload").addEventListener("change", (e) => this.read(e.target.files[0]));
    document.addEventListener("paste", (e) => {
      if ($("panel-ocr").hidden) return;
      const item = [...(e.clipboardData?.items || [])].find((i) => i.type.startsWith("image/"));
      if (item) {
        e.preventDefault();
        this.read(item.getAsFile());
      }
    });
  }

  async read(file) {
    if (!file) return;
    const seq = ++this.seq;
    this.status("reading…");
    try {
      // No size check here: the server's own bound (the body limit, then the pipeline's) answers with its message.
      const bytes = new Uint8Array(await file.arrayBuffer());
      const image = await picture(file);
      const lines = await infer(bytes);
      if (seq !== this.seq) return;
      draw(image, lines);
      list(lines);
      this.status(`${lines.length} line${lines.length === 1 ? "" : "s"}`);
      this.error(null);
    } catch (err) {
      if (seq !== this.seq) return;
      this.status("");
      this.error(err.message || "the picture could not be read");
      list([]);
    }
  }

  status(text) {
    $("ocr-status").textContent = text;
  }

  error(message) {
    $("ocr-error").textContent = message || "";
    $("ocr-error").hidden = !message;
  }
}

// KServe's binary tensor extension: the JSON header, then IMAGE as one BYTES element (a 4-byte
// little-endian length, then the bytes); the answer's outputs come back as JSON.
async function infer(bytes) {
  const header = new TextEncoder().encode(JSON.stringify({
    inputs: [{ name: "IMAGE", shape: [1], datatype: "BYTES", parameters: { binary_data_size: bytes.length + 4 } }],
    outputs: [{ name: "BOXES" }, { name: "TEXTS" }, { name: "SCORES" }],
  }));
  const body = new Uint8Array(header.length + 4 + bytes.length);
  body.set(header, 0);
  new DataView(body.buffer).setUint32(header.length, bytes.length, true);
  body.set(bytes, header.length + 4);
  const resp = await call("v2/models/ocr/infer", {
    method: "POST",
    body,
    headers: { "content-type": "application/octet-stream", "inference-header-content-length": String(header.length) },
  });
  const out = Object.fromEntries((await resp.json()).outputs.map((o) => [o.name, o.data]));
  return out.TEXTS.map((text, i) => ({
    text: String(text),
    score: Number(out.SCORES[i]),
    box: [0, 1, 2, 3].map((k) => [out.BOXES[i * 8 + 2 * k], out.BOXES[i * 8 + 2 * k + 1]]),
  }));
}

async function picture(file) {
  const url = URL.createObjectURL(file);
  try {
    const img = new Image();
    img.src = url;
    await img.decode();
    return img;
  } catch {
    return null; // the browser cannot show it; the server may still read it
  } finally {
    URL.revokeObjectURL(url);
  }
}

// The picture scaled to the canvas's width, each line's box drawn over it and numbered as listed.
function draw(image, lines) {
  const canvas = $("ocr-canvas");
  const c = canvas.getContext("2d");
  const [w, h] = image ? [image.naturalWidth, image.naturalHeight] : [640, 360];
  const s = Math.min(1, 640 / w);
  [canvas.width, canvas.height] = [Math.round(w * s), Math.round(h * s)];
  c.fillStyle = "#fff";
  c.fillRect(0, 0, canvas.width, canvas.height);
  if (image) c.drawImage(image, 0, 0, canvas.width, canvas.height);
  c.lineWidth = 2;
  c.strokeStyle = "#d33";
  c.fillStyle = "#d33";
  c.font = "bold 14px sans-serif";
  lines.forEach((line, i) => {
    c.beginPath();
    line.box.forEach(([x, y], k) => (k ? c.lineTo(x * s, y * s) : c.moveTo(x * s, y * s)));
    c.closePath();
    c.stroke();
    c.fillText(String(i + 1), line.box[0][0] * s, Math.max(12, line.box[0][1] * s - 3));
  });
  canvas.dataset.boxes = String(lines.length);
}

function list(lines) {
  $("ocr-lines").replaceChildren(...lines.map((line) => {
    const li = document.createElement("li");
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = line.text;
    const score = document.createElement("span");
    score.className = "muted";
    score.textContent = ` ${line.score.toFixed(3)}`;
    li.append(text, score);
    return li;
  }));
}

// tiler view's page: the job's images from /api/images, each shown through OpenSeadragon from the server's
// IIIF services (the input, then the labels, a class's probabilities as a heatmap), the objects of the
// viewport from /api/objects drawn over them, and the controls. URL parameters (for links and tests):
// image=K, layers=input,labels,probs,objects, class=K (the probabilities' class), opacity_<layer>=0..1,
// view=x,y,w,h (level-0 pixels to fit), size=WxH (the viewer's size in CSS pixels, else the window's),
// panel=0 (no controls or scale bar). document.body.dataset.drawn is '1' once every layer shown is fully
// loaded and the viewport's objects have come, '0' while any is on its way (for scripts that take a picture).
(function () {
  'use strict';
  const params = new URLSearchParams(window.location.search);
  const bare = params.get('panel') === '0';
  const canvas = document.getElementById('objects');
  const status = document.getElementById('status');
  const size = (params.get('size') || '').match(/^(\d{1,5})x(\d{1,5})$/);
  if (size) {
    // A fixed size: a screenshot's view does not move when a headless browser resizes its window.
    for (const e of [document.getElementById('viewer'), canvas]) {
      e.style.right = 'auto'; e.style.bottom = 'auto'; e.style.width = size[1] + 'px'; e.style.height = size[2] + 'px';
    }
  }
  let api = null, image = null, viewer = null, layers = {}, objects = [], objectsMode = '', fetchTimer = null;
  let objectsPending = false;

  function markDrawn() {
    const items = [];
    for (let i = 0; viewer && i < viewer.world.getItemCount(); i++) items.push(viewer.world.getItemAt(i));
    const shownItems = items.filter(t => t.getOpacity() > 0);
    const loaded = items.length > 0 && shownItems.every(t => t.getFullyLoaded());
    document.body.dataset.drawn = loaded && !objectsPending ? '1' : '0';
  }

  function defaultOpacity(name) { return name === 'input' ? 1 : name === 'objects' ? 1 : 0.5; }
  function shown() {
    return (params.get('layers') || 'input,labels,objects').split(',');
  }
  function opacityOf(name) {
    const v = parseFloat(params.get('opacity_' + name));
    return isNaN(v) ? defaultOpacity(name) : Math.min(1, Math.max(0, v));
  }

  fetch('api/images').then(r => r.json()).then(j => {
    api = j;
    const select = document.getElementById('image');
    j.images.forEach((im, k) => {
      const o = document.createElement('option');
      o.value = k;
      o.textContent = im.name + (im.status && im.status !== 'ok' ? ' (' + im.status + ')' : '');
      select.appendChild(o);
    });
    const k = Math.min(parseInt(params.get('image') || '0', 10) || 0, j.images.length - 1);
    select.value = k;
    select.onchange = () => { params.set('image', select.value); params.delete('view'); open(+select.value); };
    if (bare) {
      document.getElementById('panel').classList.add('hidden');
      document.getElementById('scalebar').classList.add('hidden');
    }
    open(k);
  }).catch(e => { status.textContent = 'could not list the images: ' + e; });

  function layerOf(type) { return image.layers.find(l => l.type === type); }

  function open(k) {
    document.body.dataset.drawn = '0';
    image = api.images[k];
    if (viewer) viewer.destroy();
    layers = {};
    objects = [];
    const want = shown();
    viewer = OpenSeadragon({
      element: document.getElementById('viewer'), prefixUrl: 'viewer/openseadragon/images/',
      showNavigationControl: !bare, animationTime: bare ? 0 : 0.6, blendTime: 0, immediateRender: bare,
      // The canvas drawer: exact pixels (no smoothing of labels), and no WebGL needed (headless browsers).
      drawer: 'canvas', imageSmoothingEnabled: false, maxZoomPixelRatio: 8, crossOriginPolicy: 'Anonymous'
    });
    const W = image.width;
    // Every raster covers the input's extent: its world width is the input's (1), whatever its own pixels.
    const add = (name, id, index, place) => new Promise(done => viewer.addTiledImage({
      tileSource: id + '/info.json', x: place ? place.x / W : 0, y: place ? place.y / W : 0,
      width: place ? place.width / W : 1, index: index,
      opacity: want.includes(name) ? opacityOf(name) : 0,
      success: e => { layers[name] = e.item; done(); },
      error: e => { status.textContent = 'could not open ' + name + ': ' + (e.message || e); done(); }
    }));
    const labels = layerOf('labels'), scores = layerOf('scores'), grid = layerOf('grid');
    const cls = scores ? Math.min(parseInt(params.get('class') || String(scores.classes.length - 1), 10),
                                  scores.classes.length - 1) : 0;
    const loads = [add('input', image.id, 0)];
    if (labels) loads.push(add('labels', labels.id, loads.length));
    if (scores) loads.push(add('probs', scores.classes[cls].id, loads.length));
    // A classifier's scores, a cell a window, placed as its grid lies over the input.
    const gcls = grid ? Math.min(parseInt(params.get('class') || String(grid.classes.length - 1), 10),
                                 grid.classes.length - 1) : 0;
    if (grid) loads.push(add('grid', grid.classes[gcls].id, loads.length, grid.place));
    Promise.all(loads).then(() => {
      const view = (params.get('view') || '').split(',').map(Number);
      if (view.length === 4 && view.every(v => !isNaN(v)) && view[2] > 0 && view[3] > 0) {
        // The asked view is kept through the window's resizes until the user moves it.
        let fit = new OpenSeadragon.Rect(view[0] / W, view[1] / W, view[2] / W, view[3] / W);
        let size = '';
        const refit = () => {
          const now = JSON.stringify(viewer.viewport.getContainerSize());
          if (fit && now !== size) { size = now; viewer.viewport.fitBounds(fit, true); }
        };
        refit();
        viewer.addHandler('update-viewport', refit);
        viewer.addHandler('resize', refit);
        for (const e of ['canvas-press', 'canvas-scroll', 'canvas-key']) viewer.addHandler(e, () => { fit = null; });
      } else {
        viewer.viewport.goHome(true);
      }
      viewer.forceRedraw();
      controls(labels, scores, cls, grid, gcls);
      for (let i = 0; i < viewer.world.getItemCount(); i++)
        viewer.world.getItemAt(i).addHandler('fully-loaded-change', markDrawn);
      requestObjects();
      markDrawn();
    });
    viewer.addHandler('tile-load-failed', e => { status.textContent = 'a tile failed: ' + e.message; });
    viewer.addHandler('update-viewport', () => { draw(); scalebar(); markDrawn(); });
    viewer.addHandler('animation-finish', requestObjects);
    viewer.addHandler('resize', () => { draw(); requestObjects(); });
  }

  function controls(labels, scores, cls, grid, gcls) {
    const box = document.getElementById('layers');
    box.innerHTML = '';
    const want = shown();
    const row = (name, title, extra) => {
      const div = document.createElement('div');
      div.className = 'layer';
      const on = document.createElement('input');
      on.type = 'checkbox';
      on.checked = want.includes(name);
      const range = document.createElement('input');
      range.type = 'range'; range.min = 0; range.max = 1; range.step = 0.05; range.value = opacityOf(name);
      const apply = () => {
        const v = on.checked ? +range.value : 0;
        if (name === 'objects') { canvas.style.opacity = v; } else if (layers[name]) layers[name].setOpacity(v);
      };
      on.onchange = apply; range.oninput = apply;
      const label = document.createElement('label');
      label.appendChild(on); label.appendChild(document.createTextNode(' ' + title));
      div.appendChild(label); div.appendChild(range);
      if (extra) div.appendChild(extra);
      box.appendChild(div);
      apply();
    };
    row('input', 'Input');
    if (labels) {
      const legend = document.createElement('div');
      labels.classes.forEach(c => {
        const s = document.createElement('div');
        s.innerHTML = '<span class="swatch" style="background:' + (c.color || '#000') + '"></span>';
        s.appendChild(document.createTextNode(c.name));
        legend.appendChild(s);
      });
      row('labels', 'Labels', legend);
    }
    for (const [name, title, layer, chosen] of [['probs', 'Probability', scores, cls],
                                                ['grid', 'Window scores', grid, gcls]]) {
      if (!layer) continue;
      const extra = document.createElement('div');
      const select = document.createElement('select');
      layer.classes.forEach(c => {
        const o = document.createElement('option'); o.value = c.index; o.textContent = c.name; select.appendChild(o);
      });
      select.value = chosen;
      select.onchange = () => { params.set('class', select.value); params.set('layers', 'input,labels,' + name);
                                open(+document.getElementById('image').value); };
      const stops = api.heatmap.map(s => 'rgb(' + s[1] + ',' + s[2] + ',' + s[3] + ') ' + (s[0] * 100) + '%');
      const gradient = document.createElement('div');
      gradient.className = 'gradient';
      gradient.style.background = 'linear-gradient(to right, ' + stops.join(', ') + ')';
      const ends = document.createElement('div');
      ends.innerHTML = '<span>0</span><span style="float:right">1</span>';
      extra.appendChild(select); extra.appendChild(gradient); extra.appendChild(ends);
      row(name, title, extra);
    }
    if (layerOf('objects')) row('objects', 'Objects (' + layerOf('objects').count + ')');
    status.textContent = image.mpp ? image.mpp.toFixed(3) + ' µm/px' : 'no µm/px in the file';
    scalebar();
  }

  // The viewport in level-0 pixels, clipped to the image.
  function viewportRect() {
    const b = viewer.viewport.getBounds(true), W = image.width;
    const x = Math.max(0, Math.floor(b.x * W)), y = Math.max(0, Math.floor(b.y * W));
    const r = Math.min(image.width, Math.ceil((b.x + b.width) * W)), t = Math.min(image.height, Math.ceil((b.y + b.height) * W));
    return { x: x, y: y, w: Math.max(0, r - x), h: Math.max(0, t - y) };
  }

  function requestObjects() {
    const store = layerOf('objects');
    if (!store || !viewer) return;
    clearTimeout(fetchTimer);
    objectsPending = true;
    fetchTimer = setTimeout(() => {
      const v = viewportRect();
      if (v.w <= 0 || v.h <= 0) {
        objectsPending = false;
        return markDrawn();
      }
      fetch(store.url + '&x=' + v.x + '&y=' + v.y + '&w=' + v.w + '&h=' + v.h).then(r => r.json()).then(j => {
        objectsMode = j.mode;
        objects = j.mode === 'outlines' ? j.objects : j.points;
        draw();
      }).finally(() => { objectsPending = false; markDrawn(); });
    }, bare ? 0 : 150);
  }

  function draw() {
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    const g = canvas.getContext('2d');
    g.clearRect(0, 0, w, h);
    if (!viewer) return;
    const W = image.width;
    const px = (x, y) => viewer.viewport.pixelFromPoint(new OpenSeadragon.Point(x / W, y / W), true);
    g.strokeStyle = '#00ffff'; g.fillStyle = '#00ffff'; g.lineWidth = 2;
    if (objectsMode === 'outlines') {
      objects.forEach(o => o.rings.forEach(ring => {
        g.beginPath();
        ring.forEach((p, k) => { const q = px(p[0], p[1]); if (k) g.lineTo(q.x, q.y); else g.moveTo(q.x, q.y); });
        if (ring.length === 1) { const q = px(ring[0][0], ring[0][1]); g.arc(q.x, q.y, 3, 0, 2 * Math.PI); g.fill(); }
        else { g.closePath(); g.stroke(); }
      }));
    } else {
      objects.forEach(p => { const q = px(p[0], p[1]); g.fillRect(q.x - 1.5, q.y - 1.5, 3, 3); });
    }
  }

  function scalebar() {
    if (!viewer || !image || !image.mpp) { document.getElementById('scalebar').classList.add('hidden'); return; }
    if (!bare) document.getElementById('scalebar').classList.remove('hidden');
    // Micrometres per screen pixel: level-0 pixels per screen pixel times µm per level-0 pixel.
    const zoom = viewer.viewport.getZoom(true) * viewer.viewport.getContainerSize().x / image.width;
    const um = image.mpp / zoom;
    let length = Math.pow(10, Math.floor(Math.log10(um * 120)));
    for (const f of [5, 2, 1]) if (f * length <= um * 150) { length *= f; break; }
    document.getElementById('scalebar-bar').style.width = (length / um) + 'px';
    document.getElementById('scalebar-text').textContent = length >= 1000 ? (length / 1000) + ' mm' : length + ' µm';
  }
})();

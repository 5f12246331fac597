/*
 * folnet's documentation: Web Workers for pages opened from disk (file://).
 *
 * The theme's search runs in a Web Worker, and browsers refuse `new Worker(url)` on a page
 * opened from a file. On such a page this script puts a stand-in in Worker's place: it runs
 * the worker's script in a hidden iframe of the page's own origin and carries the messages
 * both ways, which is all the search needs. Served over http(s) it does nothing.
 *
 * mkdocs.yml lists it under extra.polyfills; the theme's offline plugin adds a shim from a CDN
 * there unless an entry's path already says "iframe-worker", hence this file's name.
 * tests/project/test_docs_site.py opens a built page from disk in a headless Chromium,
 * with no network, and searches it.
 */
(function () {
  "use strict";

  if (window.location.protocol !== "file:" || window.IFrameWorker) {
    return;
  }

  /* A script element's load, as a promise. */
  function loadScript(doc, src) {
    return new Promise(function (resolve, reject) {
      var script = doc.createElement("script");
      script.src = src;
      script.onload = function () { resolve(); };
      script.onerror = function () { reject(new Error("cannot load " + src)); };
      (doc.body || doc.head || doc.documentElement).appendChild(script);
    });
  }

  /* What postMessage delivers: a copy made in the receiving window, as a worker's is. */
  function copyInto(win, data) {
    return typeof win.structuredClone === "function" ? win.structuredClone(data) : data;
  }

  function FileWorker(url) {
    var target = new EventTarget();
    var worker = this;
    var pending = [];
    var ready = false;
    var frame = document.createElement("iframe");
    var src = new URL(String(url), document.baseURI).href;

    this.onmessage = null;
    this.onerror = null;
    this.addEventListener = target.addEventListener.bind(target);
    this.removeEventListener = target.removeEventListener.bind(target);
    this.dispatchEvent = target.dispatchEvent.bind(target);

    function emit(event) {
      var handler = worker["on" + event.type];
      worker.dispatchEvent(event);
      if (typeof handler === "function") {
        handler.call(worker, event);
      }
    }

    frame.hidden = true;
    frame.tabIndex = -1;
    frame.title = "search worker";
    frame.setAttribute("aria-hidden", "true");
    (document.body || document.documentElement).appendChild(frame);
    this._frame = frame;

    var scope = frame.contentWindow;
    var doc = frame.contentDocument;

    /* The worker's own globals, as its script calls them. */
    scope.postMessage = function (data) {
      var copy = copyInto(window, data);
      setTimeout(function () { emit(new MessageEvent("message", { data: copy })); }, 0);
    };
    scope.importScripts = function () {
      var urls = Array.prototype.slice.call(arguments);
      return urls.reduce(function (done, each) {
        return done.then(function () { return loadScript(doc, new URL(each, src).href); });
      }, Promise.resolve());
    };
    scope.close = function () { worker.terminate(); };
    scope.addEventListener("error", function (event) {
      emit(new ErrorEvent("error", { message: event.message, filename: event.filename,
                                     lineno: event.lineno, colno: event.colno,
                                     error: event.error }));
    });

    this._deliver = function (data) {
      var copy = copyInto(scope, data);
      setTimeout(function () {
        scope.dispatchEvent(new scope.MessageEvent("message", { data: copy }));
      }, 0);
    };
    this._send = function (data) {
      if (ready) {
        worker._deliver(data);
      } else {
        pending.push(data);  /* until the script has set up its listeners */
      }
    };

    loadScript(doc, src).then(function () {
      ready = true;
      pending.splice(0).forEach(worker._deliver);
    }, function (error) {
      emit(new ErrorEvent("error", { message: error.message, filename: src, error: error }));
    });
  }

  FileWorker.prototype.postMessage = function (data) {
    if (this._frame) {
      this._send(data);
    }
  };

  FileWorker.prototype.terminate = function () {
    if (this._frame && this._frame.parentNode) {
      this._frame.parentNode.removeChild(this._frame);
    }
    this._frame = null;
  };

  /* The theme's search worker looks for this name on its parent to find its language files
     beside its own script. */
  window.IFrameWorker = FileWorker;
  window.Worker = FileWorker;
})();

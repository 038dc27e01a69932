package report

import (
	"context"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// findChromium returns the path of a Chromium binary. Without one the test
// is skipped, except under CI=true, where .ci/run installs Debian's
// chromium package and its absence is a failure.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found: .ci/run installs Debian's chromium package")
	}
	t.Skip("chromium not found (apt-get install chromium); the test runs under CI")
	return ""
}

// TestHTMLInChromium opens the report page of a synthetic run in headless
// Chromium, takes a screenshot and checks that every chart was drawn: the
// page is not blank, and inside each chart's frame there are many colours,
// among them the colours of both transports.
func TestHTMLInChromium(t *testing.T) {
	bin := findChromium(t)
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	shot := filepath.Join(dir, "screenshot.png")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(f, Synthetic()); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	facts := checkPage(t, raw)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--hide-scrollbars", "--force-device-scale-factor=1",
		"--user-data-dir="+filepath.Join(dir, "profile"),
		"--screenshot="+shot, "--window-size=1200,3000",
		"file://"+page)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	sf, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v\nchromium said:\n%s", err, out)
	}
	defer sf.Close()
	img, err := png.Decode(sf)
	if err != nil {
		t.Fatalf("screenshot does not decode: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 3000 {
		t.Errorf("screenshot is %v, want 1200x3000", b)
	}
	if n := distinctColors(img, img.Bounds()); n < 200 {
		t.Errorf("screenshot has %d distinct colours: blank or unstyled", n)
	}

	// Each chart's figure has a frame of its own shade (see the template's
	// frame function); find each frame and look inside it.
	for i, id := range facts.figures {
		frame := color.RGBA{R: 200, G: 200, B: uint8(200 + i), A: 255}
		box, ok := boundingBox(img, frame)
		if !ok {
			t.Errorf("chart %s: frame colour %v not on the screenshot (below 3000 px?)", id, frame)
			continue
		}
		if box.Dx() < 800 || box.Dy() < 250 {
			t.Errorf("chart %s: frame %v is too small for a chart", id, box)
			continue
		}
		inner := box.Inset(3)
		if n := distinctColors(img, inner); n < 40 {
			t.Errorf("chart %s: %d distinct colours inside its frame %v: not drawn", id, n, box)
		}
		for name, c := range transportColors {
			if n := nearColorPixels(img, inner, c, 40); n < 30 {
				t.Errorf("chart %s: %d pixels of the %s colour: its series are missing", id, n, name)
			}
		}
	}
	if len(facts.figures) != len(chartQuestions) {
		t.Errorf("%d chart figures, want %d", len(facts.figures), len(chartQuestions))
	}
}

func rgba(c color.Color) color.RGBA {
	r, g, b, a := c.RGBA()
	return color.RGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: uint8(a >> 8)}
}

func distinctColors(img image.Image, r image.Rectangle) int {
	seen := map[color.RGBA]bool{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			seen[rgba(img.At(x, y))] = true
		}
	}
	return len(seen)
}

// boundingBox returns the smallest rectangle holding every pixel of
// exactly colour c.
func boundingBox(img image.Image, c color.RGBA) (image.Rectangle, bool) {
	b := img.Bounds()
	box := image.Rectangle{Min: b.Max, Max: b.Min}
	found := false
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if rgba(img.At(x, y)) == c {
				found = true
				box.Min.X, box.Min.Y = min(box.Min.X, x), min(box.Min.Y, y)
				box.Max.X, box.Max.Y = max(box.Max.X, x+1), max(box.Max.Y, y+1)
			}
		}
	}
	return box, found
}

// nearColorPixels counts pixels within tol of c on every channel, so
// antialiased lines count too.
func nearColorPixels(img image.Image, r image.Rectangle, c color.RGBA, tol int) int {
	n := 0
	d := func(a, b uint8) int { return max(int(a)-int(b), int(b)-int(a)) }
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			p := rgba(img.At(x, y))
			if d(p.R, c.R) <= tol && d(p.G, c.G) <= tol && d(p.B, c.B) <= tol {
				n++
			}
		}
	}
	return n
}

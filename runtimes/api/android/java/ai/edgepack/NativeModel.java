package ai.edgepack;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.CharBuffer;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;
import java.nio.LongBuffer;
import java.nio.ShortBuffer;
import java.nio.channels.FileChannel;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;

/**
 * A model compiled by edgepack, run by the native edgepack runtime (the C API of the C bundle,
 * through a thin JNI layer). Generated model classes wrap one of these with typed names and
 * shapes; it can also be used directly.
 *
 * <p>Buffers: inputs and outputs are NIO buffers read/written from their position to their
 * limit; positions are not moved. Direct buffers are handed to the runtime without a copy (an
 * input that is also {@value #ALIGNMENT}-byte aligned, as {@link #allocate} makes them, is read
 * in place during {@link #run}); heap buffers are copied. Typed buffers ({@link FloatBuffer},
 * ...) must be in native byte order; a {@link ByteBuffer} is taken as raw bytes.
 *
 * <p>Threads: calls on one model are serialised (the methods are synchronized); different models
 * may run concurrently. The number of worker threads of one run is set by the environment
 * variable {@code TVM_NUM_THREADS} (default: one per core).
 *
 * <p>Dynamic sizes: a model compiled for a range of input sizes ({@code --dim W=32..1280}) has
 * inputs whose {@link TensorInfo#dim} gives the range of each dynamic dimension. Set them with
 * {@link #setInput(int, Buffer, long[])} and the data's shape (a size out of range or off the step
 * throws {@link EdgepackException} with status {@link EdgepackException#SHAPE} and the native
 * message, which names the dimension and its range), and read each output's extents of the run
 * with {@link #outputShape}; {@link #getOutput(int)} returns as many values as the run produced.
 *
 * <p>Lifetime: release the native model with {@link #close} (or try-with-resources). Calls on a
 * closed model throw {@link EdgepackException} with the native runtime's message; the tensor
 * descriptions stay readable.
 */
public final class NativeModel implements AutoCloseable {
  /** Input buffers aligned to this many bytes are used in place (no copy). */
  public static final int ALIGNMENT = 64;

  static {
    // Dependencies first: on Android the app's native library directory is not on the
    // library search path of old releases; on a desktop JVM they may come from LD_LIBRARY_PATH.
    for (String dependency : new String[] {"c++_shared", "tvm_ffi", "tvm_runtime"}) {
      try {
        System.loadLibrary(dependency);
      } catch (UnsatisfiedLinkError notPackaged) {
        // not packaged separately (static C++ runtime) or found through the dynamic linker
      }
    }
    System.loadLibrary("edgepack_jni");
  }

  private long handle;
  private final TensorInfo[] inputs;
  private final TensorInfo[] outputs;
  private final Buffer[] inputRefs; // keeps in-place input buffers alive until replaced or closed
  private final ByteBuffer[] scratch; // reused copies of heap input buffers

  private NativeModel(long handle) {
    this.handle = handle;
    try {
      this.inputs = describe(handle, false);
      this.outputs = describe(handle, true);
    } catch (RuntimeException e) {
      nativeClose(handle);
      this.handle = 0;
      throw e;
    }
    this.inputRefs = new Buffer[inputs.length];
    this.scratch = new ByteBuffer[inputs.length];
  }

  private static TensorInfo[] describe(long handle, boolean output) {
    int n = nativeCount(handle, output);
    TensorInfo[] infos = new TensorInfo[n];
    for (int i = 0; i < n; i++) {
      long[] shape = nativeShape(handle, output, i);
      TensorInfo.Dim[] dims = null;
      for (int d = 0; d < shape.length && !output; d++) {
        if (shape[d] < 0) { // a dynamic input dimension: its name and range
          if (dims == null) {
            dims = new TensorInfo.Dim[shape.length];
          }
          long[] range = nativeInputDim(handle, i, d);
          String name = nativeInputDimName(handle, i, d);
          dims[d] = new TensorInfo.Dim(name, range[0], range[1], range[2]);
        }
      }
      infos[i] =
          new TensorInfo(
              nativeName(handle, output, i),
              DType.fromCode(nativeDtype(handle, output, i)),
              shape,
              dims);
    }
    return infos;
  }

  // ---- opening --------------------------------------------------------------------------

  /**
   * Opens a model library ({@code .so}) compiled by edgepack for this device; its metadata
   * (tensor names, dtypes, shapes) is embedded in it.
   *
   * @param library the model library file
   * @return the opened model; close it when done
   * @throws EdgepackException with the native message when the file is missing, is not a model
   *     or is built for another architecture
   */
  public static NativeModel open(File library) {
    if (library == null) {
      throw new NullPointerException("library");
    }
    return new NativeModel(nativeOpen(library.getAbsolutePath()));
  }

  /**
   * Opens a model library from its bytes (for example read from an asset or downloaded). The
   * bytes from the buffer's position to its limit are copied; the buffer can be reused after
   * the call.
   *
   * @param library the bytes of the model library ({@code .so})
   * @return the opened model; close it when done
   * @throws EdgepackException with the native message when the bytes are not a model library for
   *     this device
   */
  public static NativeModel open(ByteBuffer library) {
    if (library == null) {
      throw new NullPointerException("library");
    }
    ByteBuffer direct = library.isDirect() ? library : directCopy(library);
    try {
      return new NativeModel(nativeOpenMemory(direct, direct.position(), direct.remaining()));
    } catch (EdgepackException e) {
      // Android's linker may refuse a library in anonymous memory (memfd): go through a file
      // in the app's cache directory (java.io.tmpdir) instead.
      if (e.getStatus() != EdgepackException.LOAD || !isAndroid()) {
        throw e;
      }
      try {
        return openViaTempFile(direct);
      } catch (RuntimeException second) {
        e.addSuppressed(second);
        throw e;
      }
    }
  }

  private static boolean isAndroid() {
    return "Dalvik".equals(System.getProperty("java.vm.name"));
  }

  private static NativeModel openViaTempFile(ByteBuffer bytes) {
    File tmp = null;
    try {
      tmp = File.createTempFile("edgepack-model-", ".so");
      FileOutputStream out = new FileOutputStream(tmp);
      try {
        FileChannel channel = out.getChannel();
        ByteBuffer view = bytes.duplicate();
        while (view.hasRemaining()) {
          channel.write(view);
        }
      } finally {
        out.close();
      }
      return open(tmp);
    } catch (IOException e) {
      throw new EdgepackException(
          "cannot write the model library to a temporary file: " + e.getMessage(),
          EdgepackException.IO,
          e);
    } finally {
      if (tmp != null && !tmp.delete()) {
        tmp.deleteOnExit();
      }
    }
  }

  // ---- description ------------------------------------------------------------------------

  /**
   * Returns the version of the native C API this library was built with.
   *
   * @return {@code EP_API_VERSION} of {@code edgepack.h}
   */
  public static int apiVersion() {
    return nativeApiVersion();
  }

  /**
   * Returns the number of inputs.
   *
   * @return the input count
   */
  public int inputCount() {
    return inputs.length;
  }

  /**
   * Returns the number of outputs.
   *
   * @return the output count
   */
  public int outputCount() {
    return outputs.length;
  }

  /**
   * Returns the description of input {@code index}.
   *
   * @param index 0-based, in the order of the model's parameters
   * @return name, dtype and shape
   * @throws IndexOutOfBoundsException for a bad index
   */
  public TensorInfo input(int index) {
    return inputs[index];
  }

  /**
   * Returns the description of output {@code index}.
   *
   * @param index 0-based, in the order of the model's results
   * @return name, dtype and shape
   * @throws IndexOutOfBoundsException for a bad index
   */
  public TensorInfo output(int index) {
    return outputs[index];
  }

  /**
   * Returns all inputs, in order.
   *
   * @return an unmodifiable list
   */
  public List<TensorInfo> inputs() {
    return Collections.unmodifiableList(Arrays.asList(inputs));
  }

  /**
   * Returns all outputs, in order.
   *
   * @return an unmodifiable list
   */
  public List<TensorInfo> outputs() {
    return Collections.unmodifiableList(Arrays.asList(outputs));
  }

  /**
   * Returns the index of the input called {@code name}.
   *
   * @param name the tensor name
   * @return its index
   * @throws EdgepackException (status {@link EdgepackException#NOT_FOUND}) if there is none
   */
  public synchronized int inputIndex(String name) {
    return nativeFind(handle, false, name);
  }

  /**
   * Returns the index of the output called {@code name}.
   *
   * @param name the tensor name
   * @return its index
   * @throws EdgepackException (status {@link EdgepackException#NOT_FOUND}) if there is none
   */
  public synchronized int outputIndex(String name) {
    return nativeFind(handle, true, name);
  }

  /**
   * Checks that this model has exactly the given inputs and outputs (names, dtypes, shapes).
   * Generated model classes call it when they open a library.
   *
   * @param expectedInputs the inputs, in order
   * @param expectedOutputs the outputs, in order
   * @param what how to call the expectation in the message, e.g. the generated class name
   * @throws EdgepackException (status {@link EdgepackException#METADATA}) on a mismatch
   */
  public void checkSignature(
      List<TensorInfo> expectedInputs, List<TensorInfo> expectedOutputs, String what) {
    if (!inputs().equals(expectedInputs) || !outputs().equals(expectedOutputs)) {
      throw new EdgepackException(
          "the model library does not match "
              + what
              + ": it has inputs "
              + inputs()
              + " and outputs "
              + outputs()
              + ", expected inputs "
              + expectedInputs
              + " and outputs "
              + expectedOutputs,
          EdgepackException.METADATA);
    }
  }

  // ---- running ----------------------------------------------------------------------------

  /**
   * Allocates a direct buffer of {@code byteSize} bytes, aligned to {@value #ALIGNMENT} bytes and
   * in native byte order: inputs in such buffers are read in place. Use {@code asFloatBuffer()}
   * and friends for typed access.
   *
   * @param byteSize the size in bytes
   * @return a new buffer with position 0 and limit {@code byteSize}
   */
  public static ByteBuffer allocate(long byteSize) {
    if (byteSize < 0 || byteSize > Integer.MAX_VALUE - ALIGNMENT) {
      throw new IllegalArgumentException("cannot allocate " + byteSize + " bytes in one buffer");
    }
    ByteBuffer raw = ByteBuffer.allocateDirect((int) byteSize + ALIGNMENT);
    long address = nativeAddress(raw);
    int shift = (int) ((ALIGNMENT - (address % ALIGNMENT)) % ALIGNMENT);
    raw.position(shift);
    raw.limit(shift + (int) byteSize);
    ByteBuffer aligned = raw.slice();
    aligned.order(ByteOrder.nativeOrder());
    return aligned;
  }

  /**
   * Sets input {@code index} from {@code data} (position to limit, exactly the input's byte size).
   * A direct buffer is not copied: it must stay unchanged until {@link #run} returns.
   *
   * @param index the input index
   * @param data the input values
   * @throws EdgepackException with the native message for a wrong size, index or closed model,
   *     or (status {@link EdgepackException#DTYPE}) for a buffer type that does not hold the
   *     input's dtype
   */
  public synchronized void setInput(int index, Buffer data) {
    if (data == null) {
      throw new NullPointerException("data");
    }
    boolean known = index >= 0 && index < inputs.length;
    if (known) {
      checkBuffer(data, inputs[index], "input " + index);
      if (inputs[index].isDynamic()) {
        throw new EdgepackException(
            "input "
                + index
                + " "
                + inputs[index]
                + " has dynamic dimensions: set it with setInput(index, data, shape), which"
                + " states the shape of the data",
            EdgepackException.SHAPE);
      }
    }
    Buffer direct = staged(index, data, known);
    int elem = elementSize(direct);
    nativeSetInput(handle, index, direct, (long) direct.position() * elem,
        (long) direct.remaining() * elem);
    if (known) {
      inputRefs[index] = direct;
    }
  }

  /**
   * Sets input {@code index} from {@code data} holding the dense values of {@code shape}
   * (row-major, from the buffer's position; at least that many must remain, more are ignored). A
   * dynamic dimension of the input (see {@link TensorInfo#dim}) takes any value in its range; the
   * model then runs at that size. Static dimensions must have their extent. A direct buffer is not
   * copied: it must stay unchanged until {@link #run} returns.
   *
   * @param index the input index
   * @param data the input values
   * @param shape the extents of the data, one per dimension of the input
   * @throws EdgepackException (status {@link EdgepackException#SHAPE}) with the native message
   *     for a size out of its dimension's range or off its step (it names the dimension and its
   *     range), a wrong rank or static extent, or a buffer with fewer values than the shape; with
   *     the native message for a wrong index or closed model; (status {@link
   *     EdgepackException#DTYPE}) for a buffer type that does not hold the input's dtype
   */
  public synchronized void setInput(int index, Buffer data, long[] shape) {
    if (data == null) {
      throw new NullPointerException("data");
    }
    if (shape == null) {
      throw new NullPointerException("shape");
    }
    boolean known = index >= 0 && index < inputs.length;
    if (known) {
      checkBuffer(data, inputs[index], "input " + index);
    }
    Buffer direct = staged(index, data, known);
    int elem = elementSize(direct);
    nativeSetInputTyped(handle, index, direct, (long) direct.position() * elem,
        (long) direct.remaining() * elem, known ? inputs[index].dtype().code() : 0, shape.clone());
    if (known) {
      inputRefs[index] = direct;
    }
  }

  /**
   * Sets the given inputs (if any, in order) and runs the model once.
   *
   * @param inputs one buffer per input, or none to run on the inputs set before
   * @throws EdgepackException with the native message (input missing or of the wrong size,
   *     closed model, runtime failure)
   */
  public synchronized void run(Buffer... inputs) {
    if (inputs.length != 0 && inputs.length != this.inputs.length) {
      throw new EdgepackException(
          "the model has " + this.inputs.length + " inputs, got " + inputs.length + " buffers",
          EdgepackException.INVALID_ARGUMENT);
    }
    for (int i = 0; i < inputs.length; i++) {
      setInput(i, inputs[i]);
    }
    nativeRun(handle);
  }

  /**
   * Sets the given inputs with their shapes, in order, and runs the model once: the form for
   * inputs with dynamic dimensions.
   *
   * @param inputs one buffer per input
   * @param shapes the shape of each input's data (see {@link #setInput(int, Buffer, long[])}); a
   *     {@code null} entry sets an input of static shape without one
   * @throws EdgepackException with the native message (a size out of range, inputs that disagree
   *     on a shared dimension, closed model, runtime failure)
   */
  public synchronized void run(Buffer[] inputs, long[][] shapes) {
    if (inputs.length != this.inputs.length || shapes.length != inputs.length) {
      throw new EdgepackException(
          "the model has "
              + this.inputs.length
              + " inputs, got "
              + inputs.length
              + " buffers and "
              + shapes.length
              + " shapes",
          EdgepackException.INVALID_ARGUMENT);
    }
    for (int i = 0; i < inputs.length; i++) {
      if (shapes[i] == null) {
        setInput(i, inputs[i]);
      } else {
        setInput(i, inputs[i], shapes[i]);
      }
    }
    nativeRun(handle);
  }

  /**
   * Runs the model on {@code inputs} and copies every output into {@code outputs}.
   *
   * @param inputs one buffer per input, in order
   * @param outputs one buffer per output, in order (at least the output's byte size remaining);
   *     a {@code null} entry skips that output
   * @throws EdgepackException with the native message
   */
  public synchronized void run(Buffer[] inputs, Buffer[] outputs) {
    if (outputs.length != this.outputs.length) {
      throw new EdgepackException(
          "the model has " + this.outputs.length + " outputs, got " + outputs.length + " buffers",
          EdgepackException.INVALID_ARGUMENT);
    }
    run(inputs);
    for (int i = 0; i < outputs.length; i++) {
      if (outputs[i] != null) {
        getOutput(i, outputs[i]);
      }
    }
  }

  /**
   * Copies output {@code index} of the last run into {@code dst} (from its position; at least the
   * output's byte size in that run must remain, see {@link #outputShape}). The position of {@code
   * dst} is not moved.
   *
   * @param index the output index
   * @param dst where to write the values
   * @throws EdgepackException with the native message (no run yet, buffer too small, closed
   *     model), or (status {@link EdgepackException#DTYPE}) for a buffer type that does not hold
   *     the output's dtype
   */
  public synchronized void getOutput(int index, Buffer dst) {
    if (dst == null) {
      throw new NullPointerException("dst");
    }
    if (dst.isReadOnly()) {
      throw new EdgepackException(
          "output " + index + ": the destination buffer is read-only",
          EdgepackException.INVALID_ARGUMENT);
    }
    if (index >= 0 && index < outputs.length) {
      checkBuffer(dst, outputs[index], "output " + index);
    }
    int elem = elementSize(dst);
    long bytes = (long) dst.remaining() * elem;
    if (dst.isDirect()) {
      nativeCopyOutput(handle, index, dst, (long) dst.position() * elem, bytes);
      return;
    }
    if (index >= 0 && index < outputs.length && outputs[index].isDynamic()) {
      bytes = Math.min(bytes, producedBytes(index)); // copy back only what the run produced
    }
    ByteBuffer tmp = ByteBuffer.allocateDirect((int) bytes).order(ByteOrder.nativeOrder());
    nativeCopyOutput(handle, index, tmp, 0, bytes);
    copyOut(tmp, dst);
  }

  /**
   * Returns a copy of output {@code index} of the last run in a new direct buffer (native byte
   * order), as large as the run produced it (see {@link #outputShape}).
   *
   * @param index the output index
   * @return the output's bytes; use {@code asFloatBuffer()} and friends for typed access
   * @throws EdgepackException with the native message
   */
  public synchronized ByteBuffer getOutput(int index) {
    long size = 0;
    if (index >= 0 && index < outputs.length) {
      size = outputs[index].isDynamic() ? producedBytes(index) : outputs[index].byteSize();
    }
    ByteBuffer out = allocate(size);
    getOutput(index, out);
    return out;
  }

  /**
   * Returns the shape output {@code index} had in the last run. For outputs whose extents follow
   * a dynamic input dimension (or that the model decides at run time: -1 in {@link #output}) this
   * is where to learn them.
   *
   * @param index the output index
   * @return the extents, row-major
   * @throws EdgepackException with the native message (no run yet, bad index, closed model)
   */
  public synchronized long[] outputShape(int index) {
    return nativeOutputShape(handle, index);
  }

  private long producedBytes(int index) {
    return outputs[index].byteSize(nativeOutputShape(handle, index));
  }

  /**
   * Returns whether {@link #close} was called.
   *
   * @return true once closed
   */
  public synchronized boolean isClosed() {
    return handle == 0;
  }

  /** Releases the native model. Calling it again does nothing. */
  @Override
  public synchronized void close() {
    if (handle != 0) {
      long h = handle;
      handle = 0;
      Arrays.fill(inputRefs, null);
      Arrays.fill(scratch, null);
      nativeClose(h);
    }
  }

  // ---- buffer helpers ---------------------------------------------------------------------

  private static String simpleName(Buffer b) {
    for (Class<?> c :
        new Class<?>[] {
          ByteBuffer.class, FloatBuffer.class, DoubleBuffer.class, IntBuffer.class,
          LongBuffer.class, ShortBuffer.class, CharBuffer.class
        }) {
      if (c.isInstance(b)) {
        return c.getSimpleName();
      }
    }
    return b.getClass().getName();
  }

  private static int elementSize(Buffer b) {
    if (b instanceof ByteBuffer) {
      return 1;
    }
    if (b instanceof FloatBuffer || b instanceof IntBuffer) {
      return 4;
    }
    if (b instanceof ShortBuffer || b instanceof CharBuffer) {
      return 2;
    }
    if (b instanceof LongBuffer || b instanceof DoubleBuffer) {
      return 8;
    }
    throw new EdgepackException(
        "unsupported buffer type " + b.getClass().getName(), EdgepackException.INVALID_ARGUMENT);
  }

  private static ByteOrder orderOf(Buffer b) {
    if (b instanceof FloatBuffer) {
      return ((FloatBuffer) b).order();
    }
    if (b instanceof IntBuffer) {
      return ((IntBuffer) b).order();
    }
    if (b instanceof ShortBuffer) {
      return ((ShortBuffer) b).order();
    }
    if (b instanceof LongBuffer) {
      return ((LongBuffer) b).order();
    }
    if (b instanceof DoubleBuffer) {
      return ((DoubleBuffer) b).order();
    }
    return ByteOrder.nativeOrder(); // ByteBuffer: raw bytes
  }

  private static void checkBuffer(Buffer b, TensorInfo info, String what) {
    if (b instanceof ByteBuffer) {
      return; // raw bytes of any dtype
    }
    if (!info.dtype().bufferClass().isInstance(b)) {
      throw new EdgepackException(
          what
              + " "
              + info
              + " needs a "
              + info.dtype().bufferClass().getSimpleName()
              + " (or a ByteBuffer of raw bytes), got "
              + simpleName(b),
          EdgepackException.DTYPE);
    }
    if (orderOf(b) != ByteOrder.nativeOrder()) {
      throw new EdgepackException(
          what
              + " "
              + info
              + ": the "
              + simpleName(b)
              + " is in "
              + orderOf(b)
              + " byte order, the model uses "
              + ByteOrder.nativeOrder()
              + " (create it from a ByteBuffer with order(ByteOrder.nativeOrder()), or use"
              + " NativeModel.allocate)",
          EdgepackException.INVALID_ARGUMENT);
    }
  }

  private static ByteBuffer directCopy(Buffer src) {
    return copyInto(null, src);
  }

  /** Copies src's remaining elements into reuse (if it has the right size) or a new buffer. */
  /** {@code data} itself where direct, else a copy in input {@code index}'s reused scratch buffer. */
  private Buffer staged(int index, Buffer data, boolean known) {
    if (data.isDirect()) {
      return data;
    }
    ByteBuffer copy = copyInto(known ? scratch[index] : null, data);
    if (known) {
      scratch[index] = copy;
    }
    return copy;
  }

  private static ByteBuffer copyInto(ByteBuffer reuse, Buffer src) {
    long bytes = (long) src.remaining() * elementSize(src);
    ByteBuffer out = reuse != null && reuse.capacity() == bytes ? reuse : allocate(bytes);
    out.clear();
    if (src instanceof ByteBuffer) {
      out.put(((ByteBuffer) src).duplicate());
    } else if (src instanceof FloatBuffer) {
      out.asFloatBuffer().put(((FloatBuffer) src).duplicate());
    } else if (src instanceof IntBuffer) {
      out.asIntBuffer().put(((IntBuffer) src).duplicate());
    } else if (src instanceof ShortBuffer) {
      out.asShortBuffer().put(((ShortBuffer) src).duplicate());
    } else if (src instanceof LongBuffer) {
      out.asLongBuffer().put(((LongBuffer) src).duplicate());
    } else if (src instanceof DoubleBuffer) {
      out.asDoubleBuffer().put(((DoubleBuffer) src).duplicate());
    } else if (src instanceof CharBuffer) {
      out.asCharBuffer().put(((CharBuffer) src).duplicate());
    }
    out.rewind();
    return out;
  }

  /** Copies the bytes of src (native order, position 0) into dst from its position. */
  private static void copyOut(ByteBuffer src, Buffer dst) {
    if (dst instanceof ByteBuffer) {
      ((ByteBuffer) dst).duplicate().put(src);
    } else if (dst instanceof FloatBuffer) {
      ((FloatBuffer) dst).duplicate().put(src.asFloatBuffer());
    } else if (dst instanceof IntBuffer) {
      ((IntBuffer) dst).duplicate().put(src.asIntBuffer());
    } else if (dst instanceof ShortBuffer) {
      ((ShortBuffer) dst).duplicate().put(src.asShortBuffer());
    } else if (dst instanceof LongBuffer) {
      ((LongBuffer) dst).duplicate().put(src.asLongBuffer());
    } else if (dst instanceof DoubleBuffer) {
      ((DoubleBuffer) dst).duplicate().put(src.asDoubleBuffer());
    } else if (dst instanceof CharBuffer) {
      ((CharBuffer) dst).duplicate().put(src.asCharBuffer());
    }
  }

  /**
   * Returns a short description of the model and its state.
   *
   * @return e.g. {@code NativeModel[inputs=[...], outputs=[...]]}
   */
  @Override
  public synchronized String toString() {
    List<String> parts = new ArrayList<String>();
    parts.add("inputs=" + inputs());
    parts.add("outputs=" + outputs());
    if (handle == 0) {
      parts.add("closed");
    }
    return "NativeModel" + parts;
  }

  // ---- native methods (registered by libedgepack_jni in JNI_OnLoad) -----------------------

  private static native long nativeOpen(String path);

  private static native long nativeOpenMemory(Buffer data, long offset, long size);

  private static native void nativeClose(long handle);

  private static native int nativeCount(long handle, boolean outputs);

  private static native String nativeName(long handle, boolean output, int index);

  private static native int nativeDtype(long handle, boolean output, int index);

  private static native long[] nativeShape(long handle, boolean output, int index);

  private static native int nativeFind(long handle, boolean output, String name);

  private static native long[] nativeInputDim(long handle, int index, int dim);

  private static native String nativeInputDimName(long handle, int index, int dim);

  private static native void nativeSetInput(
      long handle, int index, Buffer data, long offset, long size);

  private static native void nativeSetInputTyped(
      long handle, int index, Buffer data, long offset, long size, int dtype, long[] shape);

  private static native void nativeRun(long handle);

  private static native void nativeCopyOutput(
      long handle, int index, Buffer dst, long offset, long size);

  private static native long[] nativeOutputShape(long handle, int index);

  private static native long nativeAddress(Buffer buffer);

  private static native int nativeApiVersion();
}

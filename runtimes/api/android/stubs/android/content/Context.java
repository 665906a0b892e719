package android.content;

import android.content.pm.ApplicationInfo;
import java.io.File;

/**
 * Compile-time stand-in for android.content.Context: only the members edgepack's Java layer uses,
 * with the same signatures as the Android SDK. Used to compile classes.jar when no android.jar is
 * available, and for host tests. Never packaged: on a device the real class is used.
 */
public abstract class Context {
  /** @return the application's ApplicationInfo */
  public abstract ApplicationInfo getApplicationInfo();

  /** @return the app's code cache directory */
  public abstract File getCodeCacheDir();
}
